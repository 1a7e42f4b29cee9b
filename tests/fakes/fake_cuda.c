/* A stand-in for libcuda.so.1 on machines without a GPU (tests only): "device memory" is host memory and every
 * stream is a queue served by a thread of its own, so work completes later, in stream order, as on a GPU: a copy
 * runs when the work queued before it on its stream has, an event completes when its stream reaches it, and
 * cuStreamWaitEvent holds a stream until the event has completed. A wait ddl forgets then gives a wrong result
 * (or a deadline), not a lucky one. Each queued item takes FAKE_CUDA_DELAY_US microseconds more (default 50).
 * The legacy and per-thread default streams (handles 0, 1, 2) share one queue. fake_cuda_enqueue lets the
 * stand-in NCCL queue its collectives on a stream; fake_cuda_synchronize waits for every stream (what a test
 * does before it reads "device" memory from the host, as cudaDeviceSynchronize would). FAKE_CUDA_DEVICES sets
 * the device count (0: cuInit fails with CUDA_ERROR_NO_DEVICE); FAKE_CUDA_PENDING=1 makes every event stay
 * pending (a copy that never finishes). fake_cuda_host_bytes counts the bytes copied between host and "device". */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef void (*Work)(void*);
typedef struct Event {
  long recorded, completed; /* generations: queued records, and the last one the stream reached */
} Event;
typedef struct Item {
  struct Item* next;
  int kind; /* 0 copy, 1 record, 2 wait, 3 call */
  void* dst;
  const void* src;
  size_t n;
  Event* event;
  long generation;
  Work fn;
  void* arg;
} Item;
typedef struct Stream {
  pthread_mutex_t m;
  pthread_cond_t cv, idle;
  Item *head, *tail;
  int busy, stop;
  pthread_t thread;
  struct Stream* next_stream;
} Stream;

static pthread_mutex_t all_m = PTHREAD_MUTEX_INITIALIZER;
static Stream* streams = NULL;
static Stream* legacy = NULL;

static int devices(void) { const char* e = getenv("FAKE_CUDA_DEVICES"); return e ? atoi(e) : 1; }
static int pending(void) { return getenv("FAKE_CUDA_PENDING") != NULL; }
static void delay(void) {
  const char* e = getenv("FAKE_CUDA_DELAY_US");
  long us = e ? atol(e) : 50;
  if (us > 0) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
  }
}

static void run(Item* it) {
  delay();
  switch (it->kind) {
    case 0: memmove(it->dst, it->src, it->n); break;
    case 1: __atomic_store_n(&it->event->completed, it->generation, __ATOMIC_RELEASE); break;
    case 2:
      while (__atomic_load_n(&it->event->completed, __ATOMIC_ACQUIRE) < it->generation) usleep(20);
      break;
    case 3: it->fn(it->arg); break;
  }
}

static void* serve(void* p) {
  Stream* s = p;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->m);
    if (!s->head) break;
    Item* it = s->head;
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->m);
    run(it);
    free(it);
    pthread_mutex_lock(&s->m);
    s->busy = 0;
    if (!s->head) pthread_cond_broadcast(&s->idle);
  }
  pthread_mutex_unlock(&s->m);
  return NULL;
}

static Stream* make_stream(void) {
  Stream* s = calloc(1, sizeof(Stream));
  pthread_mutex_init(&s->m, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->idle, NULL);
  pthread_create(&s->thread, NULL, serve, s);
  pthread_mutex_lock(&all_m);
  s->next_stream = streams;
  streams = s;
  pthread_mutex_unlock(&all_m);
  return s;
}

static Stream* stream_of(void* handle) {
  if ((unsigned long)handle <= 2) { /* the legacy and per-thread default streams */
    pthread_mutex_lock(&all_m);
    int none = legacy == NULL;
    pthread_mutex_unlock(&all_m);
    if (none) {
      Stream* s = make_stream();
      pthread_mutex_lock(&all_m);
      if (!legacy) legacy = s;
      pthread_mutex_unlock(&all_m);
    }
    return legacy;
  }
  return handle;
}

static void enqueue(void* handle, Item* it) {
  Stream* s = stream_of(handle);
  pthread_mutex_lock(&s->m);
  if (s->tail) s->tail->next = it;
  else s->head = it;
  s->tail = it;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->m);
}

static void drain(Stream* s) {
  pthread_mutex_lock(&s->m);
  while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->m);
  pthread_mutex_unlock(&s->m);
}

void fake_cuda_synchronize(void) {
  pthread_mutex_lock(&all_m);
  Stream* list = streams;
  pthread_mutex_unlock(&all_m);
  for (Stream* s = list; s; s = s->next_stream) drain(s); /* (streams are only added at the head) */
}

void fake_cuda_enqueue(void* stream, Work fn, void* arg) {
  Item* it = calloc(1, sizeof(Item));
  it->kind = 3;
  it->fn = fn;
  it->arg = arg;
  enqueue(stream, it);
}

static int copy(void* dst, const void* src, size_t n, void* stream) {
  Item* it = calloc(1, sizeof(Item));
  it->dst = dst;
  it->src = src;
  it->n = n;
  enqueue(stream, it);
  return 0;
}

int cuInit(unsigned f) { (void)f; return devices() > 0 ? 0 : 100; }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuDeviceGetCount(int* n) { *n = devices(); return 0; }
int cuDeviceGet(int* d, int i) { *d = i; return i < devices() ? 0 : 101; }
int cuDevicePrimaryCtxRetain(void** c, int d) { *c = (void*)(long)(d + 1); return 0; }
int cuCtxSetCurrent(void* c) { (void)c; return 0; }
int cuStreamCreate(void** s, unsigned f) { (void)f; *s = make_stream(); return 0; }
int cuStreamDestroy_v2(void* handle) {
  /* Drained and stopped; its memory stays (another thread may still be walking the list of streams). */
  Stream* s = stream_of(handle);
  if (s == legacy) return 0;
  drain(s);
  pthread_mutex_lock(&s->m);
  s->stop = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->m);
  pthread_join(s->thread, NULL);
  return 0;
}
int cuStreamWaitEvent(void* s, void* e, unsigned f) {
  (void)f;
  Item* it = calloc(1, sizeof(Item));
  it->kind = 2;
  it->event = e;
  it->generation = __atomic_load_n(&((Event*)e)->recorded, __ATOMIC_ACQUIRE);
  enqueue(s, it);
  return 0;
}
int cuEventCreate(void** e, unsigned f) { (void)f; *e = calloc(1, sizeof(Event)); return 0; }
int cuEventDestroy_v2(void* e) { fake_cuda_synchronize(); free(e); return 0; }
int cuEventRecord(void* e, void* s) {
  Item* it = calloc(1, sizeof(Item));
  it->kind = 1;
  it->event = e;
  it->generation = __atomic_add_fetch(&((Event*)e)->recorded, 1, __ATOMIC_ACQ_REL);
  enqueue(s, it);
  return 0;
}
int cuEventQuery(void* p) {
  Event* e = p;
  if (pending()) return 600;
  return __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= __atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE) ? 0
                                                                                                           : 600;
}
static long long host_bytes[2]; /* device to host, host to device: what fake_cuda_host_bytes reports */
void fake_cuda_host_bytes(long long* to_host, long long* to_device) {
  *to_host = __atomic_load_n(&host_bytes[0], __ATOMIC_ACQUIRE);
  *to_device = __atomic_load_n(&host_bytes[1], __ATOMIC_ACQUIRE);
}
int cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, void* s) {
  __atomic_add_fetch(&host_bytes[0], (long long)n, __ATOMIC_ACQ_REL);
  return copy(h, (void*)d, n, s);
}
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, void* s) {
  __atomic_add_fetch(&host_bytes[1], (long long)n, __ATOMIC_ACQ_REL);
  return copy((void*)d, h, n, s);
}
int cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr x, size_t n, void* s) { return copy((void*)d, (void*)x, n, s); }
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) { *p = (CUdeviceptr)malloc(n); return *p ? 0 : 2; }
/* As cuMemFree does on a GPU: the memory is released once the work queued before is done. */
int cuMemFree_v2(CUdeviceptr p) { fake_cuda_synchronize(); free((void*)p); return 0; }
int cuMemHostAlloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n); return *p ? 0 : 2; }
int cuMemFreeHost(void* p) { fake_cuda_synchronize(); free(p); return 0; }
int cuGetErrorString(int rc, const char** s) {
  *s = rc == 100 ? "no CUDA-capable device is detected" : "fake CUDA error";
  return 0;
}
