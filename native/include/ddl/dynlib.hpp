// A shared library opened at run time (dlopen), so ddl builds and imports on machines without CUDA or NCCL.
#pragma once
#include <stdexcept>
#include <string>

namespace ddl {

// The GPU path cannot go on: a library is missing, or a CUDA or NCCL call failed (the message says which).
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The library is missing, or lacks an entry point ddl needs: the message names the file and the symbol.
struct LibraryError : DeviceError {
  using DeviceError::DeviceError;
};

class DynLib {
 public:
  DynLib(const std::string& path, const std::string& what);  // what: "CUDA driver", "NCCL" (for messages)
  ~DynLib();
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;
  const std::string& path() const { return path_; }

  // Points fn at the symbol; throws LibraryError if it is absent and required, else leaves fn null.
  template <class F>
  void bind(F*& fn, const char* name, bool required = true) {
    fn = reinterpret_cast<F*>(lookup(name, required));
  }

 private:
  void* lookup(const char* name, bool required);
  void* handle_ = nullptr;
  std::string path_, what_;
};

}  // namespace ddl
