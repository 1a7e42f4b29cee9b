// The only way the executor talks to peers: non-blocking point-to-point with tags (gloo's idea of a tiny
// transport). Implementations: MPI (a communicator handed over by mpi4py) and an in-process loopback.
// Waiting is the executor's: it polls test() and fails once nothing has completed for its deadline.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddl {

using Clock = std::chrono::steady_clock;
using Handle = int64_t;  // a transport-owned slot; released when test() reports completion

// A peer failed, a deadline passed, or the transport broke: the communicator must be recreated.
struct TransportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// MPI says peers died (ULFM: a process failure, or a communicator revoked by a rank that saw one). ``ranks``:
// those this rank knows to have failed, in the communicator's numbering (may be empty when only the revoke
// has arrived yet).
struct RankFailure : TransportError {
  RankFailure(const std::string& what, std::vector<int> failed) : TransportError(what), ranks(std::move(failed)) {}
  std::vector<int> ranks;
};

// The checks every transport makes, in one wording: a peer outside the communicator; a message longer than the
// receive posted for it.
inline void check_peer(int peer, int size, int rank) {
  if (peer < 0 || peer >= size)
    throw TransportError("rank " + std::to_string(rank) + ": peer " + std::to_string(peer) + " outside 0.." +
                         std::to_string(size - 1));
}

inline std::string truncation(size_t nbytes, int from, size_t capacity, int at) {
  return "message of " + std::to_string(nbytes) + " bytes from rank " + std::to_string(from) + " truncated to " +
         std::to_string(capacity) + " at rank " + std::to_string(at);
}

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int max_tag() const = 0;
  virtual std::string name() const = 0;
  virtual Handle isend(const void* data, size_t nbytes, int peer, int tag) = 0;
  virtual Handle irecv(void* data, size_t nbytes, int peer, int tag) = 0;
  // Called once per pass of the executor's loop, before it tests its handles: a transport whose every test
  // would run its library's progress engine runs it once here (MPI: one MPI_Testsome over every request).
  virtual void poll() {}
  // True once the operation is complete (the handle is then released). Throws TransportError on failure.
  virtual bool test(Handle h) = 0;
  // Called while the executor has nothing to do. ``rest``: how long it may sleep before polling again (zero:
  // not at all, the answer is expected soon). ``messages_only``: only a message can end the wait (false while
  // blocks wait on their BlockHooks: then no longer than ``rest``). MPI's progress engine already yields when
  // told to (mpi_yield_when_idle); threads of the loopback transport must yield to let their peers run.
  virtual void idle(Clock::duration rest, bool messages_only) { (void)rest, (void)messages_only; }
  // Give up every outstanding operation after a failure; the transport is unusable afterwards.
  virtual void abandon() = 0;

  // Runs checked on receipt, where the transport can (ddl's TCP): every run has a number, the same on every
  // rank, that its messages carry, so a message is only ever read by the run that sent it; ``check`` (nonzero:
  // the call's hash, no agreement round before it) is compared with the ranks' beside it on the way, and a
  // difference reaches every rank as a CallMismatch. After one, the ranks start over together: each one's
  // next run first agrees a new first number with every other, so no earlier message is ever read again
  // (within timeout_s). Throws CallMismatch at once, after starting over, where an earlier run of this rank's
  // turned out to be one that others called differently. ``bytes``: the run's buffer (how long its waits are).
  virtual void begin_run(int64_t check, const std::string& label, double timeout_s, int64_t bytes) {
    (void)check, (void)label, (void)timeout_s, (void)bytes;
  }
  // Whether the run's check has come back (always, for a run without one): a run ends only once it has.
  virtual bool settled() { return true; }
  virtual void end_run() {}  // the run finished
  // Why the run cannot go on ("" while nothing says so): set when ranks turn out to have called differently.
  virtual const std::string& mismatch() const {
    static const std::string none;
    return none;
  }
  // After a mismatch: the run's posted receives dropped, its sends finished from copies of their data (the
  // caller's buffers are its own again); the transport goes on with the next run.
  virtual void abandon_run() {}
};

// Ranks called ddl differently (the Python side raises MismatchError).
struct CallMismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ddl
