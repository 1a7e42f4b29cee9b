/* A stand-in for libnccl.so.2 on machines without a GPU (tests only), over fake_cuda's host "device" memory.
 * It runs communicators of one rank (collectives are copies), which is what ddl uses when every level goes over
 * MPI (DDL_NCCL_LEVELS=0); larger communicators are refused. FAKE_NCCL_VERSION sets the version;
 * FAKE_NCCL_HANG=1 makes communicator creation never finish (to test ddl's deadline). */
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, hang; } Comm;
static const size_t kSize[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

int ncclGetVersion(int* v) { const char* e = getenv("FAKE_NCCL_VERSION"); *v = e ? atoi(e) : 22000; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) { for (int i = 0; i < 128; ++i) id->internal[i] = (char)rand(); return 0; }
int ncclCommInitRank(Comm** c, int nranks, ncclUniqueId id, int rank) {
  (void)id; (void)rank;
  if (nranks != 1) return 5; /* ncclInvalidUsage */
  *c = malloc(sizeof(Comm));
  (*c)->nranks = nranks;
  (*c)->hang = getenv("FAKE_NCCL_HANG") != NULL;
  return (*c)->hang ? 7 : 0;
}
int ncclCommDestroy(Comm* c) { free(c); return 0; }
int ncclCommAbort(Comm* c) { free(c); return 0; }
int ncclCommGetAsyncError(Comm* c, int* state) { *state = c && c->hang ? 7 : 0; return 0; }
const char* ncclGetErrorString(int rc) { return rc == 5 ? "invalid usage" : rc == 7 ? "in progress" : "fake NCCL error"; }
const char* ncclGetLastError(Comm* c) { (void)c; return "fake NCCL runs communicators of one rank only"; }
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, Comm* c, void* st) {
  (void)op; (void)c; (void)st; memmove(r, s, n * kSize[t]); return 0;
}
int ncclAllGather(const void* s, void* r, size_t n, int t, Comm* c, void* st) {
  (void)c; (void)st; memmove(r, s, n * kSize[t]); return 0;
}
