// The CUDA driver entry points ddl uses, declared here (the C ABI of libcuda.so.1) and bound at run time.
// The driver API, not the runtime: every machine with a GPU has libcuda, and its primary context is the one
// cupy, PyTorch and NCCL use, so streams and pointers from them are valid here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddl/dynlib.hpp"

namespace ddl::cuda {

using Result = int;
using Device = int;
using DevicePtr = unsigned long long;
using Context = struct CtxSt*;
using Stream = struct StreamSt*;
using Event = struct EventSt*;

constexpr Result kSuccess = 0;
constexpr Result kNotReady = 600;
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr unsigned kHostAllocPortable = 1;

struct Driver {
  explicit Driver(const std::string& path);
  void check(Result rc, const std::string& what) const;  // throws std::runtime_error with the driver's text
  int version = 0;
  int devices = 0;

  Result (*cuInit)(unsigned);
  Result (*cuDriverGetVersion)(int*);
  Result (*cuDeviceGetCount)(int*);
  Result (*cuDeviceGet)(Device*, int);
  Result (*cuDevicePrimaryCtxRetain)(Context*, Device);
  Result (*cuCtxSetCurrent)(Context);
  Result (*cuStreamCreate)(Stream*, unsigned);
  Result (*cuStreamDestroy)(Stream);
  Result (*cuStreamWaitEvent)(Stream, Event, unsigned);
  Result (*cuEventCreate)(Event*, unsigned);
  Result (*cuEventDestroy)(Event);
  Result (*cuEventRecord)(Event, Stream);
  Result (*cuEventQuery)(Event);
  Result (*cuMemcpyDtoHAsync)(void*, DevicePtr, size_t, Stream);
  Result (*cuMemcpyHtoDAsync)(DevicePtr, const void*, size_t, Stream);
  Result (*cuMemcpyDtoDAsync)(DevicePtr, DevicePtr, size_t, Stream);
  Result (*cuMemAlloc)(DevicePtr*, size_t);
  Result (*cuMemFree)(DevicePtr);
  Result (*cuMemHostAlloc)(void**, size_t, unsigned);
  Result (*cuMemFreeHost)(void*);
  Result (*cuGetErrorString)(Result, const char**);

 private:
  DynLib lib_;
};

// Makes `device`'s primary context current on this thread (what cupy and PyTorch use).
void use_device(const Driver& d, int device);

// Device memory owned by ddl (padded work buffers).
class DeviceBuffer {
 public:
  DeviceBuffer(std::shared_ptr<Driver> d, int device, size_t nbytes);
  ~DeviceBuffer();
  DevicePtr ptr() const { return ptr_; }
  size_t size() const { return nbytes_; }

 private:
  std::shared_ptr<Driver> d_;
  int device_;
  DevicePtr ptr_ = 0;
  size_t nbytes_;
};

// Page-locked host memory, so device<->host copies run asynchronously at full PCIe speed.
class PinnedBuffer {
 public:
  PinnedBuffer(std::shared_ptr<Driver> d, size_t nbytes);
  ~PinnedBuffer();
  void* data() const { return ptr_; }
  size_t size() const { return nbytes_; }

 private:
  std::shared_ptr<Driver> d_;
  void* ptr_ = nullptr;
  size_t nbytes_;
};

}  // namespace ddl::cuda
