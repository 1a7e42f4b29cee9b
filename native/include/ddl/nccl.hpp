// NCCL for the levels whose members are GPUs of one node: the few entry points ddl uses, declared here (NCCL's
// C ABI) and bound at run time from the nvidia-nccl-cu12/-cu13 wheel or the system's libnccl.so.2.
//
// Communicators are blocking (a non-blocking one starts a thread for every collective's launch, ~0.1 ms each):
// creation runs on a thread of its own and ddl waits for it with its deadline, so a rank that never arrives is an
// error that names the group, not a hang; collectives return once queued (every rank reaches them together:
// ddl's agreement round precedes them), and ddl's waits on their events poll with the deadline and NCCL's
// asynchronous error. A failed or timed-out communicator is aborted.
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddl/cuda_driver.hpp"
#include "ddl/dynlib.hpp"
#include "ddl/reduce.hpp"

namespace ddl::nccl {

struct UniqueId {
  char internal[128];
};
using Comm = struct CommSt*;
using Result = int;
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;

// The leading fields of ncclConfig_t as NCCL 2.14 defined them; NCCL reads a config as long as its size says and
// gives the fields of later versions their defaults (the version says which it may read).
struct Config {
  size_t size = sizeof(Config);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21400;
  int blocking = 1;
  int cga_cluster_size = INT_MIN, min_ctas = INT_MIN, max_ctas = INT_MIN;  // INT_MIN: NCCL decides
  const char* net_name = nullptr;
};

struct Library {
  explicit Library(const std::string& path);
  int version = 0;  // e.g. 22703 for 2.27.3

  Result (*ncclGetVersion)(int*);
  Result (*ncclGetUniqueId)(UniqueId*);
  Result (*ncclCommInitRankConfig)(Comm*, int, UniqueId, int, Config*);
  Result (*ncclCommDestroy)(Comm);
  Result (*ncclCommAbort)(Comm);
  Result (*ncclCommGetAsyncError)(Comm, Result*);
  Result (*ncclCommCount)(Comm, int*);
  Result (*ncclCommUserRank)(Comm, int*);
  const char* (*ncclGetErrorString)(Result);
  const char* (*ncclGetLastError)(Comm);  // NCCL >= 2.13; optional
  Result (*ncclReduceScatter)(const void*, void*, size_t, int, int, Comm, cuda::Stream);
  Result (*ncclAllGather)(const void*, void*, size_t, int, Comm, cuda::Stream);
  Result (*ncclAllReduce)(const void*, void*, size_t, int, int, Comm, cuda::Stream);
  Result (*ncclBroadcast)(const void*, void*, size_t, int, int, Comm, cuda::Stream);
  Result (*ncclGroupStart)();
  Result (*ncclGroupEnd)();
  Result (*ncclCommSplit)(Comm, int, int, Comm*, Config*);  // NCCL >= 2.18; optional

  std::string error_text(Result rc, Comm comm) const;

 private:
  DynLib lib_;
};

// NCCL's codes for ddl's dtypes and ops (throws for a combination NCCL lacks).
int dtype_code(DType t);
int op_code(ReduceOp op, bool average);

// ddl's two streams on one device, shared by the NCCL groups of every level of a communicator (one order for
// every level's collectives):
//   work  - NCCL collectives and device copies, ordered after the caller's stream;
//   copy  - device<->host staging, so copies overlap the MPI transfers of other chunks.
struct Streams {
  Streams(std::shared_ptr<cuda::Driver> drv, int device);
  ~Streams();
  std::shared_ptr<cuda::Driver> drv;
  cuda::Stream work = nullptr, copy = nullptr;
};

// One rank's NCCL communicator for its group, on ddl's streams. Every wait polls with a deadline; a timeout
// aborts the communicator.
class Group {
 public:
  // Joins the group of `id` (made by one member, handed to the others by ddl's bootstrap); `streams`: another
  // group's, or null for streams of its own.
  Group(std::shared_ptr<Library> lib, std::shared_ptr<cuda::Driver> drv, int device, const UniqueId& id,
        int nranks, int rank, double timeout_s, std::shared_ptr<Streams> streams = nullptr);
  ~Group();
  // ncclCommSplit (collective over this group's members, every one calling with its color and key): the new
  // group of the members of this one's color, ordered by key, on the same streams; null for color < 0.
  static std::shared_ptr<Group> split(const std::shared_ptr<Group>& parent, int color, int key);
  std::shared_ptr<Streams> streams() const { return streams_; }
  bool can_split() const { return lib_->ncclCommSplit != nullptr; }
  // ncclGroupStart / ncclGroupEnd: the collectives queued between them (on any groups) launch together.
  void group_start();
  void group_end(const std::string& what);
  int nranks() const { return nranks_; }
  int rank() const { return rank_; }
  int device() const { return device_; }
  bool broken() const { return broken_; }

  void after(uintptr_t caller_stream);   // work waits for what the caller queued so far
  void before(uintptr_t caller_stream);  // the caller's stream waits for ddl's queued work
  void copy_dd(uintptr_t dst, uintptr_t src, size_t nbytes);
  // NCCL's collectives on the work stream (`count`: elements per rank for reduce_scatter and all_gather, of the
  // whole buffer for all_reduce and broadcast); in place where NCCL allows it (recv = send + rank * count for
  // reduce_scatter, send = recv + rank * count for all_gather, recv = send for the others).
  void reduce_scatter(uintptr_t send, uintptr_t recv, size_t count, DType t, ReduceOp op, bool average);
  void all_gather(uintptr_t send, uintptr_t recv, size_t count, DType t);
  void all_reduce(uintptr_t send, uintptr_t recv, size_t count, DType t, ReduceOp op, bool average);
  void broadcast(uintptr_t send, uintptr_t recv, size_t count, DType t, int root);
  // Staging on the copy stream; each returns a ticket for done() / wait().
  void copies_after_work();  // copies queued from now on follow the work queued so far
  size_t to_host(void* host, uintptr_t dev, size_t nbytes);
  size_t to_device(uintptr_t dev, const void* host, size_t nbytes);
  bool done(size_t ticket, const std::string& what);  // has the ticket's event passed (no waiting)
  void wait(size_t ticket, const std::string& what);  // polls done() with the deadline
  void work_after_copies();                           // work waits for every copy queued so far
  void synchronize(const std::string& what);            // waits for everything ddl queued

 private:
  void check(Result rc, const std::string& what);
  void settle(const std::string& what);  // until the last call is queued, or NCCL reports an error
  size_t record(cuda::Stream s);
  [[noreturn]] void fail(const std::string& what);
  Group(std::shared_ptr<Library> lib, std::shared_ptr<cuda::Driver> drv, int device, int nranks, int rank,
        double timeout_s, std::shared_ptr<Streams> streams);
  void create(const std::string& what, std::function<Result(Comm*)> make);  // on a thread, with the deadline
  static void abandon(Group& g);  // aborts g's communicator, leaving g unusable

  std::shared_ptr<Library> lib_;
  std::shared_ptr<cuda::Driver> drv_;
  int device_, nranks_, rank_;
  double timeout_s_;
  Comm comm_ = nullptr;
  std::shared_ptr<Streams> streams_;
  cuda::Stream work_ = nullptr, copy_ = nullptr;
  std::vector<cuda::Event> events_;  // tickets: reused from the start by every collective (after())
  size_t next_event_ = 0;
  bool copied_ = false;  // the copy stream got work since after(): before() must wait for it too
  bool broken_ = false;
};

}  // namespace ddl::nccl
