#include "ddl/mpi_transport.hpp"

#include <sched.h>

#include <climits>
#include <thread>
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

void MpiTransport::idle(Clock::duration rest, bool) {
  if (rest > Clock::duration::zero()) {
    // (Linux stretches a sleep by the thread's timer slack, 50 us by default: a rest is never shorter. Exact
    // short rests were tried: more wake-ups, more of the core spent, no faster.)
    std::this_thread::sleep_for(rest);
    return;
  }
  if (yield_when_idle_) sched_yield();
}

void MpiTransport::check(int rc, const char* what, int peer) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::string message = "rank " + std::to_string(rank_) + ": MPI " + what +
                        (peer >= 0 ? " with rank " + std::to_string(peer) : std::string()) + " failed: " +
                        std::string(text, static_cast<size_t>(len));
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

void MpiTransport::poll() {
  // One pass of MPI's progress engine for every request: testing them one by one would run it (with Open MPI's
  // epoll and, when told to, its yield) once per pending request. A completed request becomes
  // MPI_REQUEST_NULL, which is how test() knows it.
  if (slots_.empty()) return;
  done_.resize(slots_.size());
  statuses_.resize(slots_.size());
  int count = 0;
  const int rc = MPI_Testsome(static_cast<int>(slots_.size()), slots_.data(), &count, done_.data(), statuses_.data());
  if (rc == MPI_SUCCESS) return;
  if (rc != MPI_ERR_IN_STATUS) check(rc, "test", MPI_ANY_SOURCE);
  for (int i = 0; i < count; ++i) {
    const MPI_Status& st = statuses_[static_cast<size_t>(i)];
    if (st.MPI_ERROR != MPI_SUCCESS) check(st.MPI_ERROR, "test", st.MPI_SOURCE);
  }
}

bool MpiTransport::test(Handle h) {
  if (slots_[static_cast<size_t>(h)] != MPI_REQUEST_NULL) return false;  // (poll() completes requests)
  free_.push_back(h);
  return true;
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
