#include "ddl/transport.hpp"

#include <thread>

namespace ddl {

bool wait_until(Transport& t, Handle h, Clock::time_point deadline) {
  while (!t.test(h)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace ddl
