// The MPI levels of a GPU allreduce: a member's block of device memory runs through the executor in pinned host
// memory, one pipeline block at a time. Every block's copy to the host is queued up front (the copy engine
// runs them back to back); the executor starts a block once its copy has landed and, as soon as the block is
// reduced, scales it (average) and queues its copy back, so copies in both directions overlap the transfers
// of other blocks and the pipeline never restarts.
#pragma once
#include <cstdint>
#include <vector>

#include "ddl/executor.hpp"
#include "ddl/nccl.hpp"

namespace ddl {

class StagedBlocks final : public BlockHooks {
 public:
  // device: the block's first byte on the GPU; host: pinned memory as large as the plan's extent.
  StagedBlocks(nccl::Group& group, const Plan& plan, uintptr_t device, char* host, DType dtype, double factor);
  bool ready(size_t block) override;
  void finished(size_t block) override;

 private:
  nccl::Group& g_;
  uintptr_t device_;
  char* host_;
  DType dtype_;
  double factor_;
  std::vector<size_t> offset_, bytes_, arrived_;  // per block: byte range, its copy's ticket
};

// Runs `plan` over the group's staged block and leaves the group's work stream waiting for the copies back.
void run_staged(Executor& ex, nccl::Group& group, const Plan& plan, uintptr_t device, char* host, RunOptions& opt,
                double factor);

}  // namespace ddl
