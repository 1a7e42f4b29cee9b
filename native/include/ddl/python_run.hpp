// What Python hands the executor for one run, as ddl._native's Pipeline and RunOptions hold it: shared by the
// bindings (Executor.run) and the short calls (ddl._native.ShortCalls runs a known call's plan itself).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ddl/executor.hpp"

namespace ddl {

namespace nccl {
class Group;
}

struct PyPlan {
  Plan plan;
  int64_t extent = 0;  // elements the plan touches: a buffer must be at least this long
};

// The element type and op, the deadline and label, and the optional forms of a run (a header merged by max, a
// small run into another buffer, a GPU block staged through this buffer).
struct PyRunOptions {
  DType dtype = DType::float32;
  ReduceOp op = ReduceOp::sum;
  double timeout = 300.0;
  std::string label = "collective";
  std::optional<int64_t> header;  // agreement: every message carries {h, -h}, merged by max
                                  // (with run's out: the small collective, into out only if all agreed)
  int64_t capacity = 0;           // with a header: payload bytes every receive accepts
  double factor = 1.0;            // result scaled by this (avg) once reduced
  nccl::Group* group = nullptr;   // staging: the GPU block at `device` runs through the (pinned) buffer
  uintptr_t device = 0;
  int64_t check = 0;              // the call's hash, checked on receipt where the transport can (no agreement)
};

inline RunOptions native_options(const PyRunOptions& o) {
  RunOptions opt;
  opt.dtype = o.dtype;
  opt.op = o.op;
  opt.timeout_s = o.timeout;
  opt.label = o.label;
  opt.check = o.check;
  if (o.header) {
    opt.header_mode = true;
    opt.header[0] = *o.header;
    opt.header[1] = -*o.header;
    opt.header_capacity = o.capacity;
  }
  return opt;
}

}  // namespace ddl
