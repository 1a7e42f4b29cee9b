#include "ddl/dynlib.hpp"

#include <dlfcn.h>

namespace ddl {

DynLib::DynLib(const std::string& path, const std::string& what) : path_(path), what_(what) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw LibraryError("cannot load the " + what + " library " + path + ": " + (why ? why : "unknown error"));
  }
}

DynLib::~DynLib() {
  // Never dlclose: NCCL and the driver keep threads and atexit handlers that point into the library.
}

void* DynLib::lookup(const char* name, bool required) {
  dlerror();
  void* p = dlsym(handle_, name);
  if (p == nullptr && required)
    throw LibraryError("the " + what_ + " library " + path_ + " has no " + name + " (too old, or not " + what_ + ")");
  return p;
}

}  // namespace ddl
