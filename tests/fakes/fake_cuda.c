/* A stand-in for libcuda.so.1 on machines without a GPU (tests only): "device memory" is host memory, copies
 * are memcpy, streams and events are always complete. It lets the GPU path's orchestration (staging, offsets,
 * stream calls, MPI levels) run in CI; it proves nothing about real GPUs. FAKE_CUDA_DEVICES sets the device
 * count (0: cuInit fails with CUDA_ERROR_NO_DEVICE); FAKE_CUDA_PENDING=1 makes every event stay pending (a copy
 * that never finishes). */
#include <stdlib.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
static int devices(void) { const char* e = getenv("FAKE_CUDA_DEVICES"); return e ? atoi(e) : 1; }

int cuInit(unsigned f) { (void)f; return devices() > 0 ? 0 : 100; }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuDeviceGetCount(int* n) { *n = devices(); return 0; }
int cuDeviceGet(int* d, int i) { *d = i; return i < devices() ? 0 : 101; }
int cuDevicePrimaryCtxRetain(void** c, int d) { *c = (void*)(long)(d + 1); return 0; }
int cuCtxSetCurrent(void* c) { (void)c; return 0; }
int cuStreamCreate(void** s, unsigned f) { (void)f; *s = malloc(1); return 0; }
int cuStreamDestroy_v2(void* s) { free(s); return 0; }
int cuStreamWaitEvent(void* s, void* e, unsigned f) { (void)s; (void)e; (void)f; return 0; }
int cuEventCreate(void** e, unsigned f) { (void)f; *e = malloc(1); return 0; }
int cuEventDestroy_v2(void* e) { free(e); return 0; }
int cuEventRecord(void* e, void* s) { (void)e; (void)s; return 0; }
int cuEventQuery(void* e) { (void)e; return getenv("FAKE_CUDA_PENDING") ? 600 : 0; }
int cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, void* s) { (void)s; memmove(h, (void*)d, n); return 0; }
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, void* s) { (void)s; memmove((void*)d, h, n); return 0; }
int cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr x, size_t n, void* s) { (void)s; memmove((void*)d, (void*)x, n); return 0; }
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) { *p = (CUdeviceptr)malloc(n); return *p ? 0 : 2; }
int cuMemFree_v2(CUdeviceptr p) { free((void*)p); return 0; }
int cuMemHostAlloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n); return *p ? 0 : 2; }
int cuMemFreeHost(void* p) { free(p); return 0; }
int cuGetErrorString(int rc, const char** s) {
  *s = rc == 100 ? "no CUDA-capable device is detected" : "fake CUDA error";
  return 0;
}
