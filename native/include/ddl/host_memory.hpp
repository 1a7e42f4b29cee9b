// The host level: ranks of one host run their collectives through one shared-memory segment they all map,
// reading each other's data directly. No message moves on this path; ranks synchronise through counters in
// the segment, each written by one rank only (single writer, release store; readers acquire).
//
// Every collective is a sequence of *steps*, numbered alike on every rank of the communicator (one counter
// for all collective kinds). In step s each rank copies its part into its own slot of parity s % 2, then
// publishes {s, hash of its call, a value} in its arrival line of that parity, waits for every rank's arrival
// at s, and checks that all hashes equal its own: ranks that called differently all see the same hashes and
// all return "mismatch" at the same step, with no round of their own. Two parities let a rank fill step s+1
// while others still read step s; a rank reuses a parity only after every rank said it is done with it.
//
// Waits spin briefly, then yield (ranks may outnumber cores), read the clock now and then (the deadline) and
// look at the awaited rank's process (a dead writer is named within a fraction of a second, not at the
// deadline). After a failure the segment's counters are out of step: the group refuses every later call.
// Each public call holds a mutex of this process's mapping: the callers need no lock of their own.
//
// Run-ahead broadcasts: a known broadcast of up to kRunAheadBytes (HostCall::run_ahead) does not wait for every
// rank as MPI's does not. Every rank writes its own entry of a ring of kRunAheadDepth per rank (the root with the
// data), the root returns at once, each receiver waits for the root's entry alone and checks its hash on receipt.
// A rank that called differently from the one it waits for raises CallMismatch at once (a step that meets a
// run-ahead entry, or a receiver that meets its root in another collective, is a mismatch seen by some ranks only:
// no collective report is possible). The others learn it at their next full step: every rank folds the hash of
// each run-ahead call it completed (or a marker for one that raised) into the hash that step publishes, so where
// some ranks ran ahead and others raised, or ran ahead with other calls, every rank returns "mismatch" there, and
// history() names what each had called since its previous full step. A rank that makes the same broadcast by the
// full path (an array only Python takes, a first call another rank has made before) meets its run-ahead peers:
// the step counts as run ahead for all, the data is read from the root's entry or slot, whichever it wrote.
//
// Single copy: where the kernel lets a rank read its peers' memory (process_vm_readv, as Open MPI's and MPICH's
// CMA paths), broadcasts and allgathers from `single_copy_bytes` publish their buffer's address in the arrival
// line and each reader copies straight from the writer's buffer into its own: one copy instead of two, and no
// slot-sized steps. The writer returns only when every reader said it is done with the step.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddl/reduce.hpp"
#include "ddl/transport.hpp"

namespace ddl {

struct HostCall {
  int64_t hash = 0;         // the call's signature: equal on every rank that made the same call
  double timeout_s = 300.0; // fail after waiting this long on one rank
  std::string label = "collective";
  bool run_ahead = false;   // a small broadcast may run ahead (a call every rank has made before)
};

// (CallMismatch, transport.hpp: ranks called differently, seen by this rank only, as in a run-ahead step)

class HostMemory {
 public:
  // Maps the segment `name` (POSIX shared memory). The creator (one rank) makes and sizes it before the others
  // open it; nobody unlinks here (the caller unlinks as soon as every rank has mapped it, so a killed job leaves
  // nothing behind). pids: each member's process, for the liveness check; ranks: each member's rank in the
  // communicator, for messages.
  HostMemory(const std::string& name, bool create, int rank, int size, size_t slot_bytes, std::vector<int> pids,
             std::vector<int> ranks);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  static void unlink(const std::string& name);

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_; }
  bool broken() const { return !broken_.empty(); }

  // Each returns false when ranks called differently (nothing was written to the output then).
  // allreduce: dst = op over ranks of src (count elements; dst may be src), scaled by factor. Up to
  // `one_phase_bytes` every rank reduces the whole vector itself (one wait); above, each rank reduces its
  // slice and then copies every slice (two waits, a third of the reading).
  bool allreduce(const void* src, void* dst, int64_t count, DType t, ReduceOp op, double factor,
                 size_t one_phase_bytes, HostCall& call);
  // broadcast: root's buf into every rank's buf.
  bool broadcast(void* buf, size_t nbytes, int root, HostCall& call);
  // allgather with a known layout: rank r's src (lengths[r] bytes) lands at dst + offsets[r] everywhere.
  bool allgather(const void* src, void* dst, const std::vector<int64_t>& offsets,
                 const std::vector<int64_t>& lengths, HostCall& call);
  // allgather of equal parts, if they are: every rank's nbytes is published first; when all are equal, rank r's
  // src lands at dst + r * nbytes and true is returned in *equal. Otherwise *equal is false, lengths holds every
  // rank's length (the caller allocates and calls allgather with that layout) and dst is untouched.
  bool allgather_equal(const void* src, void* dst, size_t nbytes, std::vector<int64_t>& lengths, bool* equal,
                       HostCall& call);
  // reduce_scatter: rank r gets elements [starts[r], starts[r] + counts[r]) of the reduction, into dst.
  bool reduce_scatter(const void* src, void* dst, const std::vector<int64_t>& starts,
                      const std::vector<int64_t>& counts, DType t, ReduceOp op, double factor, HostCall& call);
  bool barrier(HostCall& call);

  static constexpr size_t kRunAheadBytes = 4096;  // the largest broadcast that may run ahead
  static constexpr uint64_t kRunAheadDepth = 16;  // how many steps a rank may run ahead of the slowest
  // The run-ahead calls whose hashes the last full step checked, as error messages name them ("" if none).
  const std::string& history() const { return history_; }

  // Single copy, switched on collectively: every rank publishes probe_address(), checks can_read(peer, its
  // address) for one peer, and only if all succeed does every rank call single_copy_from(bytes) (0: off).
  uintptr_t probe_address() const { return reinterpret_cast<uintptr_t>(&probe_); }
  bool can_read(int r, uintptr_t address) const;
  void single_copy_from(size_t bytes) { single_copy_ = bytes; }
  size_t single_copy_bytes() const { return single_copy_; }

 private:
  struct alignas(128) Line {
    std::atomic<uint64_t> seq;
    int64_t hash;
    int64_t value;
    uint64_t address;  // single copy: where the publisher's data of this step is, in its own address space
    int64_t call;      // the call's own hash (`hash` folds in the run-ahead history): what run-ahead peers check
    char label[88];    // the call, as a peer that meets it in a mismatch names it
  };
  static_assert(sizeof(Line) == 128, "a line is one pair of cache lines");
  bool single_copy(size_t nbytes) const { return single_copy_ != 0 && nbytes >= single_copy_; }
  void read_from(int r, void* dst, uint64_t address, size_t nbytes, HostCall& call);
  void wait_readers(uint64_t s, HostCall& call);  // every other rank closed step s: our buffer is ours again
  Line& arrival(int r, uint64_t s) const { return arrive_[2 * r + (s & 1)]; }
  char* slot(int r, uint64_t s) const { return slots_ + (2 * static_cast<size_t>(r) + (s & 1)) * slot_; }

  bool run_ahead_broadcast(void* buf, size_t nbytes, int root, HostCall& call);
  Line& entry(int r, uint64_t s) const {  // rank r's run-ahead entry of step s, its data right after it
    return *reinterpret_cast<Line*>(ahead_ + (static_cast<size_t>(r) * kRunAheadDepth + s % kRunAheadDepth) *
                                                 (sizeof(Line) + kRunAheadBytes));
  }
  char* entry_data(int r, uint64_t s) const { return reinterpret_cast<char*>(&entry(r, s) + 1); }
  void fold(const HostCall& call, bool raised);  // into the hash the next full step publishes
  [[noreturn]] void mismatch(uint64_t s, int r, const Line& theirs, const HostCall& call, const char* how);
  bool gather_steps(const char* in, char* out, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& lengths, HostCall& call);
  uint64_t open_step(HostCall& call);                    // waits until this rank's slot of the parity is free
  // Publishes, waits for all; false: hashes differ. With `ahead` (a small broadcast), peers that ran ahead with the
  // same call count as arrived and *ahead says whether any did (the step is then a run-ahead one for all).
  bool arrive(uint64_t s, int64_t value, HostCall& call, bool* ahead = nullptr);
  bool arrive_with(uint64_t s, int64_t value, const void* data, HostCall& call);  // and data's address
  // rank r's part of step s (its published address; our own: `mine`) into `to`
  void copy_part(int r, uint64_t s, const char* mine, char* to, size_t nbytes, HostCall& call);
  void publish(std::atomic<uint64_t>& line, uint64_t s) { line.store(s, std::memory_order_release); }
  void close_step(uint64_t s) { publish(done_[rank_].seq, s); }
  void wait_for(int r, const std::atomic<uint64_t>& line, uint64_t s, const char* what, HostCall& call) {
    wait_either(r, line, nullptr, s, what, call);
  }
  // Until `line` or `other` (if given) reaches s: false if `line` did, true if `other` did.
  bool wait_either(int r, const std::atomic<uint64_t>& line, const std::atomic<uint64_t>* other, uint64_t s,
                   const char* what, HostCall& call);
  void check_usable() const;
  [[noreturn]] void fail(const std::string& what, int peer, bool died);

  std::string name_;
  int rank_, size_;
  size_t slot_, bytes_ = 0;
  std::vector<int> pids_, ranks_;
  void* base_ = nullptr;
  Line* arrive_ = nullptr;   // [size][2]
  Line* reduced_ = nullptr;  // [size]: the slice of step `seq` is reduced in place, in this rank's slot
  Line* done_ = nullptr;     // [size]: finished reading everything of step `seq`
  char* ahead_ = nullptr;    // [size][kRunAheadDepth] run-ahead entries, each a Line and kRunAheadBytes
  char* slots_ = nullptr;    // [size][2][slot_]
  uint64_t step_ = 0;
  int spins_ = 1;
  size_t single_copy_ = 0;
  uint64_t probe_ = 0;  // what can_read expects at a peer's probe_address(): the magic plus the peer's rank
  uint64_t chain_ = 0;  // the hashes of the run-ahead calls since the last full step, folded (0: none)
  struct Behind {  // a run of one run-ahead call: its label, whether this rank raised on it, how many times
    std::string label;
    bool raised;
    uint64_t times;
  };
  std::vector<Behind> behind_;  // the last three runs
  std::string history_;
  std::string broken_;
  std::mutex calls_;  // one call at a time per process: threads of one rank may call without Python's lock
};

}  // namespace ddl
