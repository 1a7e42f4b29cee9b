/* A stand-in for libnccl.so.2 on machines without a GPU (tests only), over fake_cuda's host "device" memory.
 * Communicators of several processes of one host meet in a shared-memory segment named by the unique id: each
 * collective moves its bytes through one slot per rank, in rounds of at most SLOT bytes, every round between
 * two barriers, and reduces in rank order (every rank computes the same bits, as NCCL's ring does not promise,
 * but tests compare against numpy with the usual tolerances). Collectives are queued on their stream (fake_cuda's
 * fake_cuda_enqueue, found in the library DDL_CUDA_DRIVER names) and run when the stream reaches them, as
 * kernels do; a collective that fails (a peer that never comes) leaves its error in ncclCommGetAsyncError. Creation of a blocking communicator (the default, and config.blocking = 1)
 * returns once every member has joined; of a non-blocking one at once, and ncclCommGetAsyncError says "in
 * progress" until every member has. A peer that never arrives is an error after FAKE_NCCL_TIMEOUT seconds
 * (default 60), never a hang. FAKE_NCCL_VERSION sets the version; FAKE_NCCL_HANG=1 makes creation never finish
 * (ddl's deadline);
 * FAKE_NCCL_MAX_RANKS refuses larger communicators (the error path of a group NCCL cannot form);
 * FAKE_NCCL_LOG names a file each collective appends one line to as it runs:
 * "pid name nranks rank kind count element-size" (name: the communicator's segment, "-" alone) (kind: allreduce, reduce_scatter, all_gather, broadcast), what the
 * tests count bytes per level from. ncclGroupStart/End are accepted: collectives run in the order queued. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SLOT (1 << 20)
enum { kSuccess = 0, kSystemError = 2, kInvalidArgument = 4, kInvalidUsage = 5, kInProgress = 7 };

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
  int joined, arrived, generation, pad;
} Shared;
typedef struct {
  int nranks, rank, hang, aborted;
  char name[128];
  int splits; /* how many splits this member has made of it (names the new groups) */
  Shared* shared;
  unsigned char* slots; /* nranks slots of SLOT bytes after the header */
  size_t bytes;
} Comm;
typedef struct {
  size_t size;
  unsigned magic, version;
  int blocking;
} Config; /* the leading fields of ncclConfig_t */

static const size_t kSize[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static char last_error[256] = "";
typedef void (*Work)(void*);
static void (*stream_enqueue)(void*, Work, void*);  /* fake_cuda's, found at the first collective */
static void (*synchronize_all)(void);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static double timeout(void) { const char* e = getenv("FAKE_NCCL_TIMEOUT"); return e ? atof(e) : 60.0; }

int ncclGetVersion(int* v) { const char* e = getenv("FAKE_NCCL_VERSION"); *v = e ? atoi(e) : 22800; return 0; }

int ncclGetUniqueId(ncclUniqueId* id) {
  static int made = 0;
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/ddl-fake-nccl-%d-%d-%ld", (int)getpid(), made++, (long)t.tv_nsec);
  return kSuccess;
}

static int joined(Comm* c) { return __atomic_load_n(&c->shared->joined, __ATOMIC_ACQUIRE); }

static int init(Comm** out, int nranks, ncclUniqueId id, int rank, int blocking) {
  const char* most = getenv("FAKE_NCCL_MAX_RANKS");
  if (nranks < 1 || rank < 0 || rank >= nranks) return kInvalidArgument;
  if (most && nranks > atoi(most)) {
    snprintf(last_error, sizeof last_error, "fake NCCL runs communicators of at most %s ranks", most);
    return kInvalidUsage;
  }
  Comm* c = calloc(1, sizeof(Comm));
  c->nranks = nranks;
  c->rank = rank;
  c->hang = getenv("FAKE_NCCL_HANG") != NULL;
  *out = c;
  if (c->hang) {
    while (blocking) sleep(1);  /* a member that never comes */
    return kInProgress;
  }
  if (nranks == 1) return kSuccess;
  memcpy(c->name, id.internal, sizeof c->name - 1);
  c->name[sizeof c->name - 1] = 0;
  c->bytes = 4096 + (size_t)nranks * SLOT;
  int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) return kSystemError;
  void* m = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return kSystemError;
  c->shared = m;
  c->slots = (unsigned char*)m + 4096;
  if (__atomic_add_fetch(&c->shared->joined, 1, __ATOMIC_ACQ_REL) == nranks) shm_unlink(c->name);  /* all in */
  if (!blocking) return kInProgress;
  double deadline = now() + timeout();
  while (joined(c) < nranks) {
    if (now() > deadline) {
      snprintf(last_error, sizeof last_error, "fake NCCL: a member never joined (rank %d of %d)", rank, nranks);
      return kSystemError;
    }
    sched_yield();
  }
  return kSuccess;
}

int ncclCommInitRank(Comm** c, int nranks, ncclUniqueId id, int rank) { return init(c, nranks, id, rank, 1); }
int ncclCommInitRankConfig(Comm** c, int nranks, ncclUniqueId id, int rank, Config* config) {
  if (!config || config->magic != 0xcafebeef) return kInvalidArgument;
  return init(c, nranks, id, rank, config->blocking != 0);
}

int ncclCommDestroy(Comm* c) {
  if (synchronize_all) synchronize_all(); /* its queued collectives use the segment */
  if (c->shared) munmap(c->shared, c->bytes);
  free(c);
  return kSuccess;
}
/* Queued collectives of an aborted communicator stop at their next barrier; what they use is left to them. */
int ncclCommAbort(Comm* c) { __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE); return kSuccess; }

int ncclCommGetAsyncError(Comm* c, int* state) {
  if (c->hang) *state = kInProgress;
  else if (c->aborted) *state = kSystemError;
  else *state = c->shared && joined(c) < c->nranks ? kInProgress : kSuccess;
  return kSuccess;
}
const char* ncclGetErrorString(int rc) {
  return rc == kInvalidUsage ? "invalid usage" : rc == kInProgress ? "in progress"
       : rc == kSystemError ? "system error" : "fake NCCL error";
}
const char* ncclGetLastError(Comm* c) { (void)c; return last_error; }

/* Every member in, or an error after the timeout (the communicator is then unusable). */
static int barrier(Comm* c) {
  Shared* s = c->shared;
  int gen = __atomic_load_n(&s->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == c->nranks) {
    __atomic_store_n(&s->arrived, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&s->generation, 1, __ATOMIC_ACQ_REL);
    return kSuccess;
  }
  double deadline = now() + timeout();
  while (__atomic_load_n(&s->generation, __ATOMIC_ACQUIRE) == gen) {
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return kSystemError;
    if (now() > deadline) {
      snprintf(last_error, sizeof last_error, "fake NCCL: a peer never reached the collective (rank %d of %d)",
               c->rank, c->nranks);
      c->aborted = 1;
      return kSystemError;
    }
    sched_yield();
  }
  return kSuccess;
}

/* -- reductions in each type, rounded to it after every step (as a sequence of adds in that type would be) -- */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    float f = man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
    return sign ? -f : f;
  }
  bits = exp == 31 ? sign | 0x7f800000 | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  float a = f < 0 ? -f : f;
  if (a != a) return (uint16_t)(sign | 0x7e00);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
  if (a < 6.103515625e-05f) { /* subnormal half: round a / 2^-24 to nearest even */
    float q = a * 16777216.0f;
    uint32_t n = (uint32_t)q;
    float r = q - n;
    if (r > 0.5f || (r == 0.5f && (n & 1))) n++;
    return (uint16_t)(sign | n);
  }
  uint32_t m = x & 0x7fffffff, keep = m >> 13, rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (keep & 1))) keep++;
  return (uint16_t)(sign | (keep - (112 << 10)));
}
static double load(int t, const unsigned char* p) {
  switch (t) {
    case 6: { uint16_t h; memcpy(&h, p, 2); return half_to_float(h); }
    case 9: { uint16_t b; memcpy(&b, p, 2); uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }
    case 7: { float f; memcpy(&f, p, 4); return f; }
    default: { double d; memcpy(&d, p, 8); return d; }
  }
}
static void store(int t, unsigned char* p, double v) {
  switch (t) {
    case 6: { uint16_t h = float_to_half((float)v); memcpy(p, &h, 2); return; }
    case 9: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      uint16_t b = (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
      memcpy(p, &b, 2);
      return;
    }
    case 7: { float f = (float)v; memcpy(p, &f, 4); return; }
    default: memcpy(p, &v, 8);
  }
}
static long long load_int(int t, const unsigned char* p) {
  switch (t) {
    case 0: return *(const signed char*)p;
    case 1: return *p;
    case 2: { int32_t v; memcpy(&v, p, 4); return v; }
    case 3: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { long long v; memcpy(&v, p, 8); return v; }
  }
}
static int is_float(int t) { return t >= 6; }
/* acc = acc op x, element by element, in type t (op 4, avg, sums here and divides at the end) */
static void combine(int t, int op, unsigned char* acc, const unsigned char* x, size_t n) {
  size_t es = kSize[t];
  for (size_t i = 0; i < n; ++i, acc += es, x += es) {
    if (is_float(t)) {
      double a = load(t, acc), b = load(t, x);
      store(t, acc, op == 1 ? a * b : op == 2 ? (a > b ? a : b) : op == 3 ? (a < b ? a : b) : a + b);
    } else {
      long long a = load_int(t, acc), b = load_int(t, x);
      long long r = op == 1 ? a * b : op == 2 ? (a > b ? a : b) : op == 3 ? (a < b ? a : b) : a + b;
      memcpy(acc, &r, es); /* little-endian: the low bytes */
    }
  }
}
static void divide(int t, unsigned char* p, size_t n, int by) {
  for (size_t i = 0; i < n; ++i, p += kSize[t]) store(t, p, load(t, p) / by);
}
static unsigned char* slot(Comm* c, int r) { return c->slots + (size_t)r * SLOT; }

/* The reduction over ranks of `n` elements at each rank's slot offset `off`, into dst. */
static void reduce_slots(Comm* c, int t, int op, size_t off, unsigned char* dst, size_t n) {
  size_t bytes = n * kSize[t];
  unsigned char* acc = malloc(bytes ? bytes : 1);
  memcpy(acc, slot(c, 0) + off, bytes);
  for (int r = 1; r < c->nranks; ++r) combine(t, op, acc, slot(c, r) + off, n);
  if (op == 4) divide(t, acc, n, c->nranks);
  memcpy(dst, acc, bytes);
  free(acc);
}

static int start(Comm* c, int t) {
  if (!c || c->aborted || t < 0 || t > 9) return c && c->aborted ? kSystemError : kInvalidArgument;
  return kSuccess;
}
#define STEP(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int ncclAllReduce_now(const void* s, void* r, size_t n, int t, int op, Comm* c, void* st) {
  (void)st;
  STEP(start(c, t));
  size_t es = kSize[t], per = SLOT / es;
  if (c->nranks == 1) {
    memmove(r, s, n * es);
    return kSuccess;
  }
  for (size_t o = 0; o < n; o += per) {
    size_t m = n - o < per ? n - o : per;
    memcpy(slot(c, c->rank), (const unsigned char*)s + o * es, m * es);
    STEP(barrier(c));
    reduce_slots(c, t, op, 0, (unsigned char*)r + o * es, m);
    STEP(barrier(c));
  }
  return kSuccess;
}

static int ncclReduceScatter_now(const void* s, void* r, size_t n, int t, int op, Comm* c, void* st) {
  (void)st;
  STEP(start(c, t));
  size_t es = kSize[t], per = SLOT / es / c->nranks;
  if (c->nranks == 1) {
    memmove(r, s, n * es);
    return kSuccess;
  }
  for (size_t o = 0; o < n; o += per) { /* elements [o, o+m) of every rank's block b, at b*m in the slot */
    size_t m = n - o < per ? n - o : per;
    for (int b = 0; b < c->nranks; ++b)
      memcpy(slot(c, c->rank) + b * m * es, (const unsigned char*)s + (b * n + o) * es, m * es);
    STEP(barrier(c));
    reduce_slots(c, t, op, c->rank * m * es, (unsigned char*)r + o * es, m);
    STEP(barrier(c));
  }
  return kSuccess;
}

static int ncclAllGather_now(const void* s, void* r, size_t n, int t, Comm* c, void* st) {
  (void)st;
  STEP(start(c, t));
  size_t es = kSize[t], per = SLOT / es;
  if (c->nranks == 1) {
    memmove(r, s, n * es);
    return kSuccess;
  }
  for (size_t o = 0; o < n; o += per) {
    size_t m = n - o < per ? n - o : per;
    memcpy(slot(c, c->rank), (const unsigned char*)s + o * es, m * es);
    STEP(barrier(c));
    for (int q = 0; q < c->nranks; ++q) memcpy((unsigned char*)r + (q * n + o) * es, slot(c, q), m * es);
    STEP(barrier(c));
  }
  return kSuccess;
}

static int ncclBroadcast_now(const void* s, void* r, size_t n, int t, int root, Comm* c, void* st) {
  (void)st;
  STEP(start(c, t));
  size_t es = kSize[t], per = SLOT / es;
  if (root < 0 || root >= c->nranks) return kInvalidArgument;
  if (c->nranks == 1) {
    memmove(r, s, n * es);
    return kSuccess;
  }
  for (size_t o = 0; o < n; o += per) {
    size_t m = n - o < per ? n - o : per;
    if (c->rank == root) memcpy(slot(c, root), (const unsigned char*)s + o * es, m * es);
    STEP(barrier(c));
    memmove((unsigned char*)r + o * es, slot(c, root), m * es);
    STEP(barrier(c));
  }
  return kSuccess;
}

/* -- queued on the caller's stream, run when it gets there ------------------------------------------------ */
typedef struct {
  int kind, t, op, root;
  const void* s;
  void* r;
  size_t n;
  Comm* c;
} Queued;


static void find_streams(void) {
  const char* path = getenv("DDL_CUDA_DRIVER");
  void* lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (lib) {
    stream_enqueue = (void (*)(void*, Work, void*))dlsym(lib, "fake_cuda_enqueue");
    synchronize_all = (void (*)(void))dlsym(lib, "fake_cuda_synchronize");
  }
}

static void log_collective(const Queued* q) {
  static const char* kinds[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast"};
  const char* path = getenv("FAKE_NCCL_LOG");
  if (!path || !q->c) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%d %s %d %d %s %zu %zu\n", (int)getpid(), q->c->name[0] ? q->c->name : "-", q->c->nranks, q->c->rank,
          kinds[q->kind], q->n, kSize[q->t]);
  fclose(f);
}

static void run_queued(void* p) {
  Queued* q = p;
  log_collective(q);
  switch (q->kind) {
    case 0: ncclAllReduce_now(q->s, q->r, q->n, q->t, q->op, q->c, NULL); break;
    case 1: ncclReduceScatter_now(q->s, q->r, q->n, q->t, q->op, q->c, NULL); break;
    case 2: ncclAllGather_now(q->s, q->r, q->n, q->t, q->c, NULL); break;
    case 3: ncclBroadcast_now(q->s, q->r, q->n, q->t, q->root, q->c, NULL); break;
  }
  free(q);
}

static int queue(int kind, const void* s, void* r, size_t n, int t, int op, int root, Comm* c, void* st) {
  STEP(start(c, t));
  if (kind == 3 && (root < 0 || root >= c->nranks)) return kInvalidArgument;
  if (!stream_enqueue) find_streams();
  Queued* q = malloc(sizeof(Queued));
  *q = (Queued){kind, t, op, root, s, r, n, c};
  if (stream_enqueue) stream_enqueue(st, run_queued, q);
  else run_queued(q);
  return kSuccess;
}

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, Comm* c, void* st) {
  return queue(0, s, r, n, t, op, 0, c, st);
}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, Comm* c, void* st) {
  return queue(1, s, r, n, t, op, 0, c, st);
}
int ncclAllGather(const void* s, void* r, size_t n, int t, Comm* c, void* st) {
  return queue(2, s, r, n, t, 0, 0, c, st);
}
int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, Comm* c, void* st) {
  return queue(3, s, r, n, t, 0, root, c, st);
}

int ncclGroupStart(void) { return kSuccess; }
int ncclGroupEnd(void) { return kSuccess; }
int ncclCommCount(const Comm* c, int* n) { *n = c->nranks; return kSuccess; }
int ncclCommUserRank(const Comm* c, int* r) { *r = c->rank; return kSuccess; }

/* Collective over the parent's members: each publishes (color, key) in its slot, and the members of one color
 * join a communicator named after the parent, the split's number and the color, ranked by (key, parent rank). */
int ncclCommSplit(Comm* c, int color, int key, Comm** out, Config* config) {
  if (!c || c->aborted) return kInvalidArgument;
  if (!stream_enqueue) find_streams();
  if (synchronize_all) synchronize_all(); /* queued collectives use the slots */
  int n = c->nranks, me = 0, members = 0, number = c->splits++;
  int* table = malloc(2 * sizeof(int) * (size_t)n);
  if (n == 1) {
    table[0] = color;
    table[1] = key;
  } else {
    int mine[2] = {color, key};
    memcpy(slot(c, c->rank), mine, sizeof mine);
    STEP(barrier(c));
    for (int r = 0; r < n; ++r) memcpy(table + 2 * r, slot(c, r), 2 * sizeof(int));
    STEP(barrier(c));
  }
  *out = NULL;
  if (color < 0) {
    free(table);
    return kSuccess;
  }
  for (int r = 0; r < n; ++r) {
    if (table[2 * r] != color) continue;
    members++;
    if (table[2 * r + 1] < key || (table[2 * r + 1] == key && r < c->rank)) me++;
  }
  free(table);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "%.80s.%d.%d", c->name[0] ? c->name : "/ddl-fake-nccl-one", number, color);
  return init(out, members, id, me, !config || config->blocking != 0);
}
