// The host memory level's calls worked out once per signature (Python keeps one per call it has checked): the
// short paths pass buffers and one of these, not the call's parts converted on every call.
#pragma once
#include <cstdint>
#include <vector>

#include "ddl/host_memory.hpp"
#include "ddl/reduce.hpp"

namespace ddl {

struct HostAllreduce {
  DType dtype;
  ReduceOp op;
  double factor;
  size_t one_phase;
  HostCall call;
};

// A reduce_scatter: every rank's part (start and count, in elements) and the op.
struct HostReduceScatter {
  std::vector<int64_t> starts, counts;
  DType dtype;
  ReduceOp op;
  double factor;
  HostCall call;
};

}  // namespace ddl
