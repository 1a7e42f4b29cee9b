#include "ddl/staging.hpp"

#include <algorithm>

namespace ddl {

StagedBlocks::StagedBlocks(nccl::Group& group, const Plan& plan, uintptr_t device, char* host, DType dtype,
                           double factor)
    : g_(group), device_(device), host_(host), dtype_(dtype), factor_(factor) {
  const size_t es = dtype_size(dtype);
  g_.copies_after_work();
  for (const Block& b : plan.blocks) {
    int64_t extent = 0;
    for (const Step& s : plan.programs[static_cast<size_t>(b.program)].steps)
      extent = std::max(extent, s.offset + s.count);
    offset_.push_back(static_cast<size_t>(b.offset) * es);
    bytes_.push_back(static_cast<size_t>(extent) * es);
    arrived_.push_back(g_.to_host(host_ + offset_.back(), device_ + offset_.back(), bytes_.back()));
  }
}

bool StagedBlocks::ready(size_t block) { return g_.done(arrived_[block], "a staged copy to the host"); }

void StagedBlocks::finished(size_t block) {
  char* data = host_ + offset_[block];
  if (factor_ != 1.0) scale(data, static_cast<int64_t>(bytes_[block] / dtype_size(dtype_)), dtype_, factor_);
  g_.to_device(device_ + offset_[block], data, bytes_[block]);
}

void run_staged(Executor& ex, nccl::Group& group, const Plan& plan, uintptr_t device, char* host, RunOptions& opt,
                double factor) {
  StagedBlocks hooks(group, plan, device, host, opt.dtype, factor);
  opt.hooks = &hooks;
  ex.run(plan, host, opt);
  group.work_after_copies();
}

}  // namespace ddl
