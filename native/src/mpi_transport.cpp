#include "ddl/mpi_transport.hpp"

#include <sched.h>

#include <climits>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: ULFM's MPIX_ names (MPICH declares them in mpi.h)
#endif

namespace ddl {

MpiTransport::MpiTransport(MPI_Comm comm, bool yield_when_idle) : comm_(comm), yield_when_idle_(yield_when_idle) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) max_tag_ = *ub;
}

void MpiTransport::idle() {
  if (yield_when_idle_) sched_yield();
}

void MpiTransport::check(int rc, const char* what, int peer) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::string message = "rank " + std::to_string(rank_) + ": MPI " + what + " with rank " + std::to_string(peer) +
                        " failed: " + std::string(text, static_cast<size_t>(len));
#ifdef MPIX_ERR_PROC_FAILED
  int cls = rc;
  MPI_Error_class(rc, &cls);
  if (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING || cls == MPIX_ERR_REVOKED) {
    // Tell every other rank at once: their pending operations on this communicator end with MPIX_ERR_REVOKED
    // instead of waiting for their deadline on a peer that is gone or a peer that is waiting on it.
    MPIX_Comm_revoke(comm_);
    throw RankFailure(message, failed_ranks());
  }
#endif
  throw TransportError(message);
}

std::vector<int> MpiTransport::failed_ranks() const {
  std::vector<int> out;
#ifdef MPIX_ERR_PROC_FAILED
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm_, &failed) != MPI_SUCCESS) return out;
  int n = 0;
  MPI_Group_size(failed, &n);
  if (n > 0 && MPI_Comm_group(comm_, &all) == MPI_SUCCESS) {
    std::vector<int> theirs(static_cast<size_t>(n)), ours(static_cast<size_t>(n), MPI_UNDEFINED);
    for (int i = 0; i < n; ++i) theirs[static_cast<size_t>(i)] = i;
    MPI_Group_translate_ranks(failed, n, theirs.data(), all, ours.data());
    for (int r : ours)
      if (r != MPI_UNDEFINED) out.push_back(r);
    MPI_Group_free(&all);
  }
  MPI_Group_free(&failed);
#endif
  return out;
}

Handle MpiTransport::take_slot(MPI_Request r) {
  if (!free_.empty()) {
    Handle h = free_.back();
    free_.pop_back();
    slots_[static_cast<size_t>(h)] = r;
    return h;
  }
  slots_.push_back(r);
  return static_cast<Handle>(slots_.size() - 1);
}

static int as_count(size_t nbytes, int rank) {
  // The planner keeps every message below 2 GiB (blocks); guard the int count all the same.
  if (nbytes > static_cast<size_t>(INT_MAX))
    throw TransportError("rank " + std::to_string(rank) + ": message of " + std::to_string(nbytes) +
                         " bytes exceeds the MPI count limit");
  return static_cast<int>(nbytes);
}

Handle MpiTransport::isend(const void* data, size_t nbytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Isend(data, as_count(nbytes, rank_), MPI_BYTE, peer, tag, comm_, &r), "isend", peer);
  return take_slot(r);
}

Handle MpiTransport::irecv(void* data, size_t nbytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Irecv(data, as_count(nbytes, rank_), MPI_BYTE, peer, tag, comm_, &r), "irecv", peer);
  return take_slot(r);
}

bool MpiTransport::test(Handle h) {
  MPI_Request& r = slots_[static_cast<size_t>(h)];
  int done = 0;
  MPI_Status st;
  int rc = MPI_Test(&r, &done, &st);
  if (rc != MPI_SUCCESS) check(rc, "test", st.MPI_SOURCE);
  if (done) free_.push_back(h);
  return done != 0;
}

void MpiTransport::abandon() {
  // Cancel what MPI allows; requests that cannot be cancelled are freed so nothing waits on them.
  for (MPI_Request& r : slots_) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
  slots_.clear();
  free_.clear();
}

}  // namespace ddl
