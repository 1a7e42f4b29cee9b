// Transport over an MPI communicator (a private duplicate made by the Python side, so ddl's tags never meet
// the user's traffic). Errors are returned, not fatal, so a broken peer becomes a TransportError.
#pragma once
#include <mpi.h>

#include <vector>

#include "ddl/transport.hpp"

namespace ddl {

class MpiTransport final : public Transport {
 public:
  // yield_when_idle: sched_yield() whenever the executor has nothing to do (for an MPI that spins, such as
  // MPICH, where ranks outnumber cores; Open MPI yields inside its progress engine when told to).
  MpiTransport(MPI_Comm comm, bool yield_when_idle);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int max_tag() const override { return max_tag_; }
  std::string name() const override { return "mpi"; }
  Handle isend(const void* data, size_t nbytes, int peer, int tag) override;
  Handle irecv(void* data, size_t nbytes, int peer, int tag) override;
  void poll() override;
  bool test(Handle h) override;
  void abandon() override;
  void idle(Clock::duration rest, bool messages_only) override;

 private:
  Handle take_slot(MPI_Request r);
  void check(int rc, const char* what, int peer) const;
  std::vector<int> failed_ranks() const;

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, max_tag_ = 32767;
  bool yield_when_idle_ = false;
  std::vector<MPI_Request> slots_;
  std::vector<Handle> free_;
  std::vector<int> done_;            // MPI_Testsome's outputs, kept between polls
  std::vector<MPI_Status> statuses_;
};

}  // namespace ddl
