#include "ddl/cuda_driver.hpp"

#include <stdexcept>

namespace ddl::cuda {

Driver::Driver(const std::string& path) : lib_(path, "CUDA driver") {
  lib_.bind(cuInit, "cuInit");
  lib_.bind(cuDriverGetVersion, "cuDriverGetVersion");
  lib_.bind(cuDeviceGetCount, "cuDeviceGetCount");
  lib_.bind(cuDeviceGet, "cuDeviceGet");
  lib_.bind(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  lib_.bind(cuCtxSetCurrent, "cuCtxSetCurrent");
  lib_.bind(cuStreamCreate, "cuStreamCreate");
  lib_.bind(cuStreamDestroy, "cuStreamDestroy_v2");
  lib_.bind(cuStreamWaitEvent, "cuStreamWaitEvent");
  lib_.bind(cuEventCreate, "cuEventCreate");
  lib_.bind(cuEventDestroy, "cuEventDestroy_v2");
  lib_.bind(cuEventRecord, "cuEventRecord");
  lib_.bind(cuEventQuery, "cuEventQuery");
  lib_.bind(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  lib_.bind(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  lib_.bind(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  lib_.bind(cuMemAlloc, "cuMemAlloc_v2");
  lib_.bind(cuMemFree, "cuMemFree_v2");
  lib_.bind(cuMemHostAlloc, "cuMemHostAlloc");
  lib_.bind(cuMemFreeHost, "cuMemFreeHost");
  lib_.bind(cuGetErrorString, "cuGetErrorString");
  check(cuInit(0), "cuInit (is there a GPU and a working driver?)");
  check(cuDriverGetVersion(&version), "cuDriverGetVersion");
  check(cuDeviceGetCount(&devices), "cuDeviceGetCount");
}

void Driver::check(Result rc, const std::string& what) const {
  if (rc == kSuccess) return;
  const char* text = nullptr;
  if (cuGetErrorString(rc, &text) != kSuccess || text == nullptr) text = "unknown error";
  throw DeviceError("CUDA " + what + " failed: " + text + " (" + std::to_string(rc) + ")");
}

void use_device(const Driver& d, int device) {
  if (device < 0 || device >= d.devices)
    throw DeviceError("CUDA device " + std::to_string(device) + " does not exist (this process sees " +
                                std::to_string(d.devices) + ")");
  Device dev = 0;
  Context ctx = nullptr;
  d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<Driver> d, int device, size_t nbytes)
    : d_(std::move(d)), device_(device), nbytes_(nbytes) {
  use_device(*d_, device_);
  d_->check(d_->cuMemAlloc(&ptr_, nbytes_ ? nbytes_ : 1), "cuMemAlloc of " + std::to_string(nbytes_) + " bytes");
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  try {
    use_device(*d_, device_);  // the context may not be current on the thread that drops the last reference
  } catch (...) {
  }
  d_->cuMemFree(ptr_);
}

PinnedBuffer::PinnedBuffer(std::shared_ptr<Driver> d, size_t nbytes) : d_(std::move(d)), nbytes_(nbytes) {
  d_->check(d_->cuMemHostAlloc(&ptr_, nbytes_ ? nbytes_ : 1, kHostAllocPortable),
            "cuMemHostAlloc of " + std::to_string(nbytes_) + " pinned bytes");
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) d_->cuMemFreeHost(ptr_);
}

}  // namespace ddl::cuda
