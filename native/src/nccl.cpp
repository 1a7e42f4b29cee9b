#include "ddl/nccl.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace ddl::nccl {

Library::Library(const std::string& path) : lib_(path, "NCCL") {
  lib_.bind(ncclGetVersion, "ncclGetVersion");
  lib_.bind(ncclGetUniqueId, "ncclGetUniqueId");
  lib_.bind(ncclCommInitRankConfig, "ncclCommInitRankConfig");
  lib_.bind(ncclCommDestroy, "ncclCommDestroy");
  lib_.bind(ncclCommAbort, "ncclCommAbort");
  lib_.bind(ncclCommGetAsyncError, "ncclCommGetAsyncError");
  lib_.bind(ncclCommCount, "ncclCommCount");
  lib_.bind(ncclCommUserRank, "ncclCommUserRank");
  lib_.bind(ncclGetErrorString, "ncclGetErrorString");
  lib_.bind(ncclGetLastError, "ncclGetLastError", false);
  lib_.bind(ncclReduceScatter, "ncclReduceScatter");
  lib_.bind(ncclAllGather, "ncclAllGather");
  lib_.bind(ncclAllReduce, "ncclAllReduce");
  lib_.bind(ncclBroadcast, "ncclBroadcast");
  lib_.bind(ncclGroupStart, "ncclGroupStart");
  lib_.bind(ncclGroupEnd, "ncclGroupEnd");
  lib_.bind(ncclCommSplit, "ncclCommSplit", false);
  if (ncclGetVersion(&version) != kSuccess) throw LibraryError("NCCL " + path + ": ncclGetVersion failed");
  if (version < 21400)  // ncclConfig_t and bfloat16 need 2.14
    throw LibraryError("NCCL " + path + " is version " + std::to_string(version) + "; ddl needs 2.14 or newer");
}

std::string Library::error_text(Result rc, Comm comm) const {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError ? ncclGetLastError(comm) : nullptr;
  if (last && *last) text += std::string(": ") + last;
  return text;
}

int dtype_code(DType t) {
  switch (t) {
    case DType::float16: return 6;
    case DType::bfloat16: return 9;
    case DType::float32: return 7;
    case DType::float64: return 8;
    case DType::int32: return 2;
    case DType::int64: return 4;
    case DType::uint8: return 1;
  }
  throw std::invalid_argument("no NCCL type for this dtype");
}

int op_code(ReduceOp op, bool average) {
  if (average) {
    if (op != ReduceOp::sum) throw std::invalid_argument("average is a sum, then a scale");
    return 4;  // ncclAvg
  }
  switch (op) {
    case ReduceOp::sum: return 0;
    case ReduceOp::prod: return 1;
    case ReduceOp::max: return 2;
    case ReduceOp::min: return 3;
  }
  throw std::invalid_argument("no NCCL op for this reduction");
}

namespace {
using Clock = std::chrono::steady_clock;
constexpr size_t kMaxTickets = 1 << 16;  // events per collective: 3 per staged block
}  // namespace

namespace {
// A communicator being made on a thread of its own: creation blocks until every member has joined, so the
// caller waits for it with the deadline instead. A member that never comes leaves the thread waiting; it
// destroys what it made if it ever finishes after the caller gave up.
struct Creation {
  std::mutex m;
  std::condition_variable cv;
  bool done = false, abandoned = false;
  Result rc = kSuccess;
  Comm comm = nullptr;
};
}  // namespace

Streams::Streams(std::shared_ptr<cuda::Driver> d, int device) : drv(std::move(d)) {
  cuda::use_device(*drv, device);
  drv->check(drv->cuStreamCreate(&work, cuda::kStreamNonBlocking), "cuStreamCreate");
  drv->check(drv->cuStreamCreate(&copy, cuda::kStreamNonBlocking), "cuStreamCreate");
}

Streams::~Streams() {
  if (work) drv->cuStreamDestroy(work);
  if (copy) drv->cuStreamDestroy(copy);
}

Group::Group(std::shared_ptr<Library> lib, std::shared_ptr<cuda::Driver> drv, int device, int nranks, int rank,
             double timeout_s, std::shared_ptr<Streams> streams)
    : lib_(std::move(lib)), drv_(std::move(drv)), device_(device), nranks_(nranks), rank_(rank),
      timeout_s_(timeout_s) {
  cuda::use_device(*drv_, device_);
  streams_ = streams ? std::move(streams) : std::make_shared<Streams>(drv_, device_);
  work_ = streams_->work;
  copy_ = streams_->copy;
}

Group::Group(std::shared_ptr<Library> lib, std::shared_ptr<cuda::Driver> drv, int device, const UniqueId& id,
             int nranks, int rank, double timeout_s, std::shared_ptr<Streams> streams)
    : Group(std::move(lib), std::move(drv), device, nranks, rank, timeout_s, std::move(streams)) {
  create("ncclCommInitRankConfig", [lib = lib_, id, nranks, rank](Comm* comm) {
    Config config;  // blocking: NCCL launches each collective on the calling thread (non-blocking
                    // communicators start a thread for every launch, ~0.1 ms a collective)
    return lib->ncclCommInitRankConfig(comm, nranks, id, rank, &config);
  });
}

std::shared_ptr<Group> Group::split(const std::shared_ptr<Group>& parent, int color, int key) {
  if (!parent->can_split()) throw DeviceError("NCCL " + std::to_string(parent->lib_->version) + " has no ncclCommSplit");
  if (parent->broken_) throw DeviceError("NCCL group is unusable after an earlier failure; call ddl.finalize()");
  // (the size and rank are learnt once made: every member of the color counts)
  std::shared_ptr<Group> made(new Group(parent->lib_, parent->drv_, parent->device_, 0, 0, parent->timeout_s_,
                                        parent->streams_));
  Comm from = parent->comm_;
  try {
    made->create("ncclCommSplit", [lib = parent->lib_, from, color, key](Comm* comm) {
      Config config;
      return lib->ncclCommSplit(from, color < 0 ? -1 : color, key, comm, &config);
    });
  } catch (const DeviceError&) {
    // A split that failed or never finished may still be using the parent on its thread: abort the parent (its
    // waits stop) rather than let it be destroyed under that thread later.
    abandon(*parent);
    throw;
  }
  if (!made->comm_) return nullptr;  // (no color: not a member of any new group)
  return made;
}

void Group::create(const std::string& how, std::function<Result(Comm*)> make) {
  auto made = std::make_shared<Creation>();
  std::thread([made, lib = lib_, drv = drv_, device = device_, make = std::move(make)] {
    Comm comm = nullptr;
    Result rc = kSuccess;
    try {
      cuda::use_device(*drv, device);
      rc = make(&comm);
    } catch (...) {
      rc = 1;  // ncclUnhandledCudaError: the device could not be made current
    }
    std::lock_guard<std::mutex> hold(made->m);
    if (made->abandoned) {
      if (comm) lib->ncclCommDestroy(comm);
      return;
    }
    made->rc = rc;
    made->comm = comm;
    made->done = true;
    made->cv.notify_all();
  }).detach();
  const std::string what = "creating the NCCL communicator (" + how + ", rank " + std::to_string(rank_) + " of " +
                           std::to_string(nranks_) + ")";
  std::unique_lock<std::mutex> hold(made->m);
  if (!made->cv.wait_for(hold, std::chrono::duration<double>(timeout_s_), [&] { return made->done; })) {
    made->abandoned = true;
    hold.unlock();
    fail(what + ": no progress for " + std::to_string(timeout_s_) +
         " s (DDL_TIMEOUT; a member of the group never joined?)");
  }
  comm_ = made->comm;
  if (made->rc != kSuccess) fail(what + ": " + how + ": " + lib_->error_text(made->rc, comm_));
  if (comm_ && nranks_ == 0) {  // made by a split: learn its size and this member's rank from NCCL
    if (lib_->ncclCommCount(comm_, &nranks_) != kSuccess || lib_->ncclCommUserRank(comm_, &rank_) != kSuccess)
      fail(what + ": ncclCommCount / ncclCommUserRank failed");
  }
}

void Group::abandon(Group& g) {
  if (g.comm_ && !g.broken_) g.lib_->ncclCommAbort(g.comm_);
  g.comm_ = nullptr;
  g.broken_ = true;
}

void Group::group_start() {
  if (lib_->ncclGroupStart() != kSuccess) fail("ncclGroupStart failed");
}

void Group::group_end(const std::string& what) {
  Result rc = lib_->ncclGroupEnd();
  if (rc != kSuccess && rc != kInProgress) fail(what + ": ncclGroupEnd: " + lib_->error_text(rc, comm_));
}

Group::~Group() {
  try {
    cuda::use_device(*drv_, device_);
  } catch (...) {
  }
  if (comm_) (broken_ ? lib_->ncclCommAbort(comm_) : lib_->ncclCommDestroy(comm_));
  for (cuda::Event e : events_) drv_->cuEventDestroy(e);
}

void Group::fail(const std::string& what) {
  if (comm_ && !broken_) lib_->ncclCommAbort(comm_);  // stop kernels that wait for peers that will not come
  comm_ = nullptr;
  broken_ = true;
  throw DeviceError("NCCL group: " + what);
}

void Group::check(Result rc, const std::string& what) {
  if (broken_) throw DeviceError("NCCL group is unusable after an earlier failure; call ddl.finalize()");
  if (rc != kSuccess && rc != kInProgress) fail(what + ": " + lib_->error_text(rc, comm_));
  settle(what);
}

void Group::settle(const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  while (true) {
    Result state = kSuccess;
    Result rc = lib_->ncclCommGetAsyncError(comm_, &state);
    if (rc != kSuccess) fail(what + ": ncclCommGetAsyncError: " + lib_->error_text(rc, comm_));
    if (state == kSuccess) return;
    if (state != kInProgress) fail(what + ": " + lib_->error_text(state, comm_));
    if (Clock::now() > deadline) fail(what + ": no progress for " + std::to_string(timeout_s_) + " s (DDL_TIMEOUT)");
    std::this_thread::yield();
  }
}

void Group::after(uintptr_t caller_stream) {
  next_event_ = 0;  // tickets live for one collective
  copied_ = false;
  size_t t = record(reinterpret_cast<cuda::Stream>(caller_stream));
  drv_->check(drv_->cuStreamWaitEvent(work_, events_[t], 0), "cuStreamWaitEvent");
}

void Group::before(uintptr_t caller_stream) {
  for (cuda::Stream s : {work_, copy_}) {
    if (s == copy_ && !copied_) continue;  // (one event less on a call that copied nothing)
    size_t t = record(s);
    drv_->check(drv_->cuStreamWaitEvent(reinterpret_cast<cuda::Stream>(caller_stream), events_[t], 0),
                "cuStreamWaitEvent");
  }
}

size_t Group::record(cuda::Stream s) {
  if (next_event_ == kMaxTickets) throw DeviceError("NCCL group: more than 65536 staged copies in one call");
  if (next_event_ == events_.size()) {
    cuda::Event e = nullptr;
    drv_->check(drv_->cuEventCreate(&e, cuda::kEventDisableTiming), "cuEventCreate");
    events_.push_back(e);
  }
  drv_->check(drv_->cuEventRecord(events_[next_event_], s), "cuEventRecord");
  return next_event_++;
}

void Group::copy_dd(uintptr_t dst, uintptr_t src, size_t nbytes) {
  if (nbytes) drv_->check(drv_->cuMemcpyDtoDAsync(dst, src, nbytes, work_), "cuMemcpyDtoDAsync");
}

namespace {
void* at(uintptr_t p) { return reinterpret_cast<void*>(p); }
}  // namespace

void Group::reduce_scatter(uintptr_t send, uintptr_t recv, size_t count, DType t, ReduceOp op, bool average) {
  check(lib_->ncclReduceScatter(at(send), at(recv), count, dtype_code(t), op_code(op, average), comm_, work_),
        "ncclReduceScatter of " + std::to_string(count) + " elements per rank");
}

void Group::all_gather(uintptr_t send, uintptr_t recv, size_t count, DType t) {
  check(lib_->ncclAllGather(at(send), at(recv), count, dtype_code(t), comm_, work_),
        "ncclAllGather of " + std::to_string(count) + " elements per rank");
}

void Group::all_reduce(uintptr_t send, uintptr_t recv, size_t count, DType t, ReduceOp op, bool average) {
  check(lib_->ncclAllReduce(at(send), at(recv), count, dtype_code(t), op_code(op, average), comm_, work_),
        "ncclAllReduce of " + std::to_string(count) + " elements");
}

void Group::broadcast(uintptr_t send, uintptr_t recv, size_t count, DType t, int root) {
  check(lib_->ncclBroadcast(at(send), at(recv), count, dtype_code(t), root, comm_, work_),
        "ncclBroadcast of " + std::to_string(count) + " elements from member " + std::to_string(root));
}

void Group::copies_after_work() {
  copied_ = true;
  size_t w = record(work_);
  drv_->check(drv_->cuStreamWaitEvent(copy_, events_[w], 0), "cuStreamWaitEvent");
}

size_t Group::to_host(void* host, uintptr_t dev, size_t nbytes) {
  copied_ = true;
  if (nbytes) drv_->check(drv_->cuMemcpyDtoHAsync(host, dev, nbytes, copy_), "cuMemcpyDtoHAsync");
  return record(copy_);
}

size_t Group::to_device(uintptr_t dev, const void* host, size_t nbytes) {
  copied_ = true;
  if (nbytes) drv_->check(drv_->cuMemcpyHtoDAsync(dev, host, nbytes, copy_), "cuMemcpyHtoDAsync");
  return record(copy_);
}

void Group::work_after_copies() {
  size_t c = record(copy_);
  drv_->check(drv_->cuStreamWaitEvent(work_, events_[c], 0), "cuStreamWaitEvent");
}

bool Group::done(size_t ticket, const std::string& what) {
  if (ticket >= next_event_) throw std::invalid_argument("NCCL group: unknown ticket");
  cuda::Result rc = drv_->cuEventQuery(events_[ticket]);
  if (rc == cuda::kSuccess) return true;
  if (rc != cuda::kNotReady) drv_->check(rc, "cuEventQuery (" + what + ")");
  if (comm_) {  // an NCCL kernel queued before this event may have failed
    Result state = kSuccess;
    lib_->ncclCommGetAsyncError(comm_, &state);
    if (state != kSuccess && state != kInProgress) fail(what + ": " + lib_->error_text(state, comm_));
  }
  return false;
}

void Group::wait(size_t ticket, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  while (!done(ticket, what)) {
    if (Clock::now() > deadline)
      fail(what + ": the GPU made no progress for " + std::to_string(timeout_s_) + " s (DDL_TIMEOUT)");
    std::this_thread::yield();
  }
}

void Group::synchronize(const std::string& what) {
  work_after_copies();
  wait(record(work_), what);
}

}  // namespace ddl::nccl
