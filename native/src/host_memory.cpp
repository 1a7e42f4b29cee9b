#include "ddl/host_memory.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "ddl/transport.hpp"

namespace ddl {

namespace {

constexpr uint64_t kMagic = 0x64646c2d686f7374ull;  // "ddl-host"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 128;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A process that has exited (or is a zombie its parent has not reaped yet) cannot write any more.
bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Rank r's share of n elements split in units of `unit` (whole cache lines where the type allows).
void share(int64_t n, int64_t unit, int parts, int r, int64_t* lo, int64_t* hi) {
  const int64_t units = (n + unit - 1) / unit;
  *lo = std::min(n, units * r / parts * unit);
  *hi = std::min(n, units * (r + 1) / parts * unit);
}

// The input itself, or a copy of it where the output overlaps it anywhere but at `same` (the output position the
// input may be, in place): later steps read input the earlier ones would have overwritten.
const char* unless_overlapping(const char* in, size_t in_bytes, const char* out, size_t out_bytes, const char* same,
                               std::vector<char>& copy) {
  if (in_bytes == 0 || in == same || !(in < out + out_bytes && out < in + in_bytes)) return in;
  copy.assign(in, in + in_bytes);
  return copy.data();
}

// Under Yama's ptrace_scope 1 a process may read only its descendants' memory; a rank lets its peers (same user)
// read its own, as Open MPI's CMA path does. Scopes 2 and 3 refuse (single copy then stays off).
void let_peers_read() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

}  // namespace

HostMemory::HostMemory(const std::string& name, bool create, int rank, int size, size_t slot_bytes,
                       std::vector<int> pids, std::vector<int> ranks)
    : name_(name), rank_(rank), size_(size), slot_(round_up(std::max<size_t>(slot_bytes, kPage), kPage)),
      pids_(std::move(pids)), ranks_(std::move(ranks)) {
  if (size < 1 || rank < 0 || rank >= size || pids_.size() != static_cast<size_t>(size) ||
      ranks_.size() != static_cast<size_t>(size))
    throw std::invalid_argument("host memory: rank, size, pids and ranks do not fit together");
  const size_t lines = 1 + 2 * static_cast<size_t>(size) + 2 * static_cast<size_t>(size);
  const size_t control = round_up(lines * kLine, kPage);
  const size_t ahead = round_up(static_cast<size_t>(size) * kRunAheadDepth * (sizeof(Line) + kRunAheadBytes), kPage);
  bytes_ = control + ahead + 2 * static_cast<size_t>(size) * slot_;
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("host memory: shm_open(" + name + ") failed: " + std::strerror(errno));
  if (create) {
    // Reserve every page now: a segment that tmpfs cannot back fails here, not with SIGBUS mid-collective.
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
    if (rc != 0) {
      close(fd);
      shm_unlink(name.c_str());
      throw std::runtime_error("host memory: cannot reserve " + std::to_string(bytes_) + " bytes in /dev/shm: " +
                               std::strerror(rc));
    }
  } else {
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes_) {
      close(fd);
      throw std::runtime_error("host memory: segment " + name + " has another size than this rank expects");
    }
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::runtime_error("host memory: mmap of " + name + " failed: " + std::strerror(errno));
  }
  auto* line = static_cast<Line*>(base_);
  if (create) {  // fresh tmpfs pages are zero: every counter starts at step 0
    line[0].hash = static_cast<int64_t>(kMagic);
    line[0].value = static_cast<int64_t>(size) << 32 | static_cast<int64_t>(slot_ / kPage);
  } else if (line[0].hash != static_cast<int64_t>(kMagic) ||
             line[0].value != (static_cast<int64_t>(size) << 32 | static_cast<int64_t>(slot_ / kPage))) {
    munmap(base_, bytes_);
    base_ = nullptr;
    throw std::runtime_error("host memory: segment " + name + " was made for another group");
  }
  arrive_ = line + 1;
  reduced_ = arrive_ + 2 * size;
  done_ = reduced_ + size;
  ahead_ = static_cast<char*>(base_) + control;
  slots_ = ahead_ + ahead;
  // Where ranks outnumber cores, the rank being waited for may need this core: yield at once (measured at 4
  // ranks on 2 cores: 32 spins before each yield cost 10-25% more per call than one, 1000 spins 2-5x).
  spins_ = size > cpus_available() ? 1 : 4096;
  probe_ = kMagic + static_cast<uint64_t>(ranks_[static_cast<size_t>(rank_)]);
  let_peers_read();
}

bool HostMemory::can_read(int r, uintptr_t address) const {
  if (r < 0 || r >= size_) return false;
  uint64_t got = 0;
  iovec local{&got, sizeof got}, remote{reinterpret_cast<void*>(address), sizeof got};
  return process_vm_readv(pids_[static_cast<size_t>(r)], &local, 1, &remote, 1, 0) == sizeof got &&
         got == kMagic + static_cast<uint64_t>(ranks_[static_cast<size_t>(r)]);
}

void HostMemory::read_from(int r, void* dst, uint64_t address, size_t nbytes, HostCall& call) {
  auto* to = static_cast<char*>(dst);
  for (size_t done = 0; done < nbytes;) {
    iovec local{to + done, nbytes - done}, remote{reinterpret_cast<void*>(address + done), nbytes - done};
    const ssize_t n = process_vm_readv(pids_[static_cast<size_t>(r)], &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    const std::string me = "rank " + std::to_string(ranks_[static_cast<size_t>(rank_)]) + ": ";
    const std::string peer = "rank " + std::to_string(ranks_[static_cast<size_t>(r)]);
    if (err == ESRCH)
      fail(me + peer + " (pid " + std::to_string(pids_[static_cast<size_t>(r)]) + ") ended during " + call.label +
               " (host memory level, while this rank read its buffer)",
           r, true);
    fail(me + "reading " + peer + "'s buffer during " + call.label + " failed: " + std::strerror(err), r, false);
  }
}

void HostMemory::wait_readers(uint64_t s, HostCall& call) {
  for (int r = 0; r < size_; ++r)
    if (r != rank_) wait_for(r, done_[r].seq, s, "read of this rank's buffer", call);
}

HostMemory::~HostMemory() {
  if (base_) munmap(base_, bytes_);
}

void HostMemory::unlink(const std::string& name) { shm_unlink(name.c_str()); }

void HostMemory::check_usable() const {
  if (!broken_.empty())
    throw TransportError("this communicator's host memory level is unusable after an earlier failure (" + broken_ +
                         "); call ddl.finalize() and ddl.init() to recreate it");
}

void HostMemory::fail(const std::string& what, int peer, bool died) {
  broken_ = what;
  if (died) throw RankFailure(what, {ranks_[static_cast<size_t>(peer)]});
  throw TransportError(what);
}

bool HostMemory::wait_either(int r, const std::atomic<uint64_t>& line, const std::atomic<uint64_t>* other,
                             uint64_t s, const char* what, HostCall& call) {
  const auto reached = [&](const std::atomic<uint64_t>* l) { return l && l->load(std::memory_order_acquire) >= s; };
  if (reached(&line)) return false;
  if (reached(other)) return true;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(call.timeout_s));
  auto next_look = start + std::chrono::milliseconds(100);
  for (unsigned round = 1;; ++round) {
    for (int i = 0; i < spins_; ++i) {
      if (reached(&line)) return false;
      if (reached(other)) return true;
      cpu_relax();
    }
    sched_yield();
    if (round % 64) continue;
    const auto now = Clock::now();
    const int peer = ranks_[static_cast<size_t>(r)];
    if (now >= next_look) {
      next_look = now + std::chrono::milliseconds(100);
      if (!process_alive(pids_[static_cast<size_t>(r)]) && !reached(&line) && !reached(other))
        fail("rank " + std::to_string(ranks_[static_cast<size_t>(rank_)]) + ": rank " + std::to_string(peer) +
                 " (pid " + std::to_string(pids_[static_cast<size_t>(r)]) + ") ended during " + call.label +
                 " (host memory level, waiting for its " + what + ")",
             r, true);
    }
    if (now - start > limit) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", call.timeout_s);
      fail("rank " + std::to_string(ranks_[static_cast<size_t>(rank_)]) + ": " + call.label +
               " made no progress for " + seconds + " s (DDL_TIMEOUT); waiting on rank " + std::to_string(peer) +
               " on the host memory level (its " + what + " of step " + std::to_string(s) +
               "). The peer may be stuck elsewhere, or ranks called different collectives.",
           r, false);
    }
  }
}

uint64_t HostMemory::open_step(HostCall& call) {
  check_usable();
  const uint64_t s = ++step_;
  if (s > 2)
    for (int r = 0; r < size_; ++r)
      if (r != rank_) wait_for(r, done_[r].seq, s - 2, "release of a slot", call);
  return s;
}

bool HostMemory::arrive_with(uint64_t s, int64_t value, const void* data, HostCall& call) {
  arrival(rank_, s).address = reinterpret_cast<uint64_t>(data);
  return arrive(s, value, call);
}

namespace {

uint64_t mix(uint64_t h, uint64_t x) {  // splitmix64's finaliser over the running value and the next hash
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

void put_label(char (&to)[88], const std::string& label) {
  const size_t n = std::min(label.size(), sizeof to - 1);
  std::memcpy(to, label.data(), n);
  to[n] = '\0';
}

}  // namespace

void HostMemory::fold(const HostCall& call, bool raised) {
  // A rank that raised folds the same marker whatever its call: where every rank raised, the histories still
  // agree; where some ranks ran ahead successfully, theirs hold the call and differ from the raisers'.
  constexpr uint64_t kRaised = 0x7261697365642121ull;
  chain_ = mix(chain_ ? chain_ : 1, raised ? kRaised : static_cast<uint64_t>(call.hash));
  if (!behind_.empty() && behind_.back().raised == raised && behind_.back().label == call.label) {
    ++behind_.back().times;
    return;
  }
  if (behind_.size() == 3) behind_.erase(behind_.begin());  // the last three kinds of call: where ranks differ
  behind_.push_back({call.label, raised, 1});
}

void HostMemory::mismatch(uint64_t s, int r, const Line& theirs, const HostCall& call, const char* how) {
  close_step(s);
  fold(call, true);
  const std::string me = std::to_string(ranks_[static_cast<size_t>(rank_)]);
  const std::string peer = std::to_string(ranks_[static_cast<size_t>(r)]);
  throw CallMismatch("rank " + me + ": ranks called ddl differently: ranks " + me + ": " + call.label + "; ranks " +
                     peer + ": " + std::string(theirs.label, strnlen(theirs.label, sizeof theirs.label)) + " (" +
                     how + "; the other ranks raise at their next collective that waits for every rank)");
}

bool HostMemory::arrive(uint64_t s, int64_t value, HostCall& call, bool* ahead) {
  Line& mine = arrival(rank_, s);
  const int64_t hash = chain_ ? static_cast<int64_t>(mix(chain_, static_cast<uint64_t>(call.hash))) : call.hash;
  mine.hash = hash;
  mine.value = value;
  mine.call = call.hash;
  put_label(mine.label, call.label);
  publish(mine.seq, s);
  bool same = true, ran_ahead = false;
  int other = -1;  // a rank whose own call differs from ours
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Line& theirs = arrival(r, s);
    if (wait_either(r, theirs.seq, &entry(r, s).seq, s, "arrival", call)) {
      if (!ahead || entry(r, s).hash != call.hash)
        mismatch(s, r, entry(r, s), call, "a broadcast ran ahead where this rank made another call");
      ran_ahead = true;
      continue;
    }
    same &= theirs.hash == hash;
    if (theirs.call != call.hash && other < 0) other = r;
  }
  if (ran_ahead) {  // a run-ahead step for every rank: our own calls compared, the history checked later
    if (other >= 0) mismatch(s, other, arrival(other, s), call, "another rank ran this step ahead");
    *ahead = true;
    fold(call, false);
    return true;
  }
  // Every rank saw every hash: the run-ahead history is checked (and, on a mismatch, reported) by all alike.
  history_.clear();
  for (const auto& [label, raised, times] : behind_)
    history_ += (history_.empty() ? "" : ", ") + label + (raised ? " (raised here)" : "") +
                (times > 1 ? " x" + std::to_string(times) : "");
  chain_ = 0, behind_.clear();
  if (!same) close_step(s);
  return same;
}

bool HostMemory::allreduce(const void* src, void* dst, int64_t count, DType t, ReduceOp op, double factor,
                           size_t one_phase_bytes, HostCall& call) {
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  if (t == DType::uint8 && count > 0) throw std::invalid_argument("no reductions for uint8");  // before any step
  const size_t es = dtype_size(t);
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  const size_t total = static_cast<size_t>(count) * es;
  if (total <= std::min(one_phase_bytes, slot_)) {  // every rank reduces all of it, in rank order: one wait
    const uint64_t s = open_step(call);
    std::memcpy(slot(rank_, s), in, total);
    if (!arrive(s, 0, call)) return false;
    std::memcpy(out, slot(0, s), total);
    for (int r = 1; r < size_ && count > 0; ++r) reduce_into(out, slot(r, s), count, t, op);
    close_step(s);
  } else {  // each rank reduces its slice in its own slot, then everyone copies every slice out
    std::vector<char> copy;
    in = unless_overlapping(in, total, out, total, out, copy);
    const int64_t unit = std::max<int64_t>(1, 64 / static_cast<int64_t>(es));
    const int64_t per_step = static_cast<int64_t>(slot_ / es) / unit * unit;
    for (int64_t off = 0; off < count; off += per_step) {
      const int64_t c = std::min(per_step, count - off);
      const uint64_t s = open_step(call);
      std::memcpy(slot(rank_, s), in + off * es, static_cast<size_t>(c) * es);
      if (!arrive(s, 0, call)) return false;
      int64_t lo, hi;
      share(c, unit, size_, rank_, &lo, &hi);
      char* mine = slot(rank_, s) + lo * es;
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && hi > lo) reduce_into(mine, slot(r, s) + lo * es, hi - lo, t, op);
      publish(reduced_[rank_].seq, s);
      for (int k = 0; k < size_; ++k) {
        const int r = (rank_ + k) % size_;  // start with our own slice: the others may still be reducing
        share(c, unit, size_, r, &lo, &hi);
        if (hi <= lo) continue;
        if (r != rank_) wait_for(r, reduced_[r].seq, s, "reduced slice", call);
        std::memcpy(out + (off + lo) * es, slot(r, s) + lo * es, static_cast<size_t>(hi - lo) * es);
      }
      close_step(s);
    }
    if (count == 0) {  // nothing to move: the step still checks the call
      const uint64_t s = open_step(call);
      if (!arrive(s, 0, call)) return false;
      close_step(s);
    }
  }
  if (factor != 1.0) scale(out, count, t, factor);
  return true;
}

bool HostMemory::broadcast(void* buf, size_t nbytes, int root, HostCall& call) {
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  if (root < 0 || root >= size_) throw std::invalid_argument("broadcast: root is not a rank of this group");
  if (call.run_ahead && nbytes <= kRunAheadBytes) return run_ahead_broadcast(buf, nbytes, root, call);
  auto* data = static_cast<char*>(buf);
  if (single_copy(nbytes)) {
    const uint64_t s = open_step(call);
    if (!arrive_with(s, 0, data, call)) return false;
    if (rank_ != root) read_from(root, data, arrival(root, s).address, nbytes, call);
    close_step(s);
    if (rank_ == root) wait_readers(s, call);
    return true;
  }
  for (size_t off = 0; off < nbytes || off == 0; off += slot_) {
    const size_t c = std::min(slot_, nbytes - off);
    const uint64_t s = open_step(call);
    if (rank_ == root) std::memcpy(slot(root, s), data + off, c);
    bool ahead = false;  // (peers may run this call ahead where it fits an entry)
    if (!arrive(s, 0, call, nbytes <= kRunAheadBytes ? &ahead : nullptr)) return false;
    const bool from_entry = ahead && entry(root, s).seq.load(std::memory_order_acquire) >= s;  // the root ran ahead
    if (rank_ != root) std::memcpy(data + off, from_entry ? entry_data(root, s) : slot(root, s), c);
    close_step(s);
    if (nbytes == 0) break;
  }
  return true;
}

bool HostMemory::run_ahead_broadcast(void* buf, size_t nbytes, int root, HostCall& call) {
  check_usable();
  const uint64_t s = ++step_;
  if (s > kRunAheadDepth)  // our entry of this step was last read in step s - depth
    for (int r = 0; r < size_; ++r)
      if (r != rank_) wait_for(r, done_[r].seq, s - kRunAheadDepth, "release of a run-ahead entry", call);
  Line& mine = entry(rank_, s);
  mine.hash = call.hash;
  put_label(mine.label, call.label);
  if (rank_ == root) std::memcpy(entry_data(rank_, s), buf, nbytes);
  publish(mine.seq, s);  // (receivers publish theirs too: a rank that thinks it is the root checks them)
  if (rank_ != root) {
    const Line& theirs = entry(root, s);
    const char* from = entry_data(root, s);
    if (wait_either(root, theirs.seq, &arrival(root, s).seq, s, "run-ahead broadcast", call)) {
      // the root took the full path: the same call leaves its data in its slot (written before it arrived)
      if (arrival(root, s).call != call.hash) mismatch(s, root, arrival(root, s), call, "the root made another call");
      from = slot(root, s);
    } else if (theirs.hash != call.hash) {
      mismatch(s, root, theirs, call, "the rank this one took for its root called otherwise");
    }
    std::memcpy(buf, from, nbytes);
  }
  close_step(s);
  fold(call, false);
  return true;
}

bool HostMemory::allgather(const void* src, void* dst, const std::vector<int64_t>& offsets,
                           const std::vector<int64_t>& lengths, HostCall& call) {
  if (offsets.size() != static_cast<size_t>(size_) || lengths.size() != offsets.size())
    throw std::invalid_argument("allgather: one offset and one length per rank");
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  int64_t end = 0;
  for (int r = 0; r < size_; ++r) end = std::max(end, offsets[r] + lengths[r]);
  std::vector<char> copy;
  in = unless_overlapping(in, static_cast<size_t>(lengths[rank_]), out, static_cast<size_t>(end),
                          out + offsets[rank_], copy);
  if (!single_copy(static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()))))
    return gather_steps(in, out, offsets, lengths, call);
  const uint64_t s = open_step(call);
  if (!arrive_with(s, 0, in, call)) return false;
  for (int r = 0; r < size_; ++r) copy_part(r, s, in, out + offsets[r], static_cast<size_t>(lengths[r]), call);
  close_step(s);
  wait_readers(s, call);
  return true;
}

void HostMemory::copy_part(int r, uint64_t s, const char* mine, char* to, size_t nbytes, HostCall& call) {
  if (r != rank_)
    read_from(r, to, arrival(r, s).address, nbytes, call);
  else if (to != mine)
    std::memcpy(to, mine, nbytes);
}

bool HostMemory::gather_steps(const char* in, char* out, const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& lengths, HostCall& call) {
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const auto piece = [&](int r, int64_t lo) { return std::clamp<int64_t>(lengths[r] - lo, 0, static_cast<int64_t>(slot_)); };
  for (int64_t lo = 0; lo < longest || lo == 0; lo += static_cast<int64_t>(slot_)) {
    const uint64_t s = open_step(call);
    std::memcpy(slot(rank_, s), in + lo, static_cast<size_t>(piece(rank_, lo)));
    if (!arrive(s, 0, call)) return false;
    for (int r = 0; r < size_; ++r) {
      char* to = out + offsets[r] + lo;
      const char* from = r == rank_ ? in + lo : slot(r, s);
      if (to != from) std::memcpy(to, from, static_cast<size_t>(piece(r, lo)));
    }
    close_step(s);
    if (longest == 0) break;
  }
  return true;
}

bool HostMemory::allgather_equal(const void* src, void* dst, size_t nbytes, std::vector<int64_t>& lengths,
                                 bool* equal, HostCall& call) {
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  // The first step carries every rank's length with its first piece; with equal lengths it is the first step
  // of the gather itself, and the rest follows as allgather's.
  auto* out = static_cast<char*>(dst);
  std::vector<char> copy;  // (in place: this rank's rows of dst are src)
  const char* in = unless_overlapping(static_cast<const char*>(src), nbytes, out, nbytes * static_cast<size_t>(size_),
                                      out + static_cast<size_t>(rank_) * nbytes, copy);
  const bool direct = single_copy(nbytes);  // (if the rows turn out equal, every rank's is the same)
  const size_t first = direct ? nbytes : std::min(nbytes, slot_);
  const uint64_t s = open_step(call);
  if (!direct) std::memcpy(slot(rank_, s), in, first);
  if (!arrive_with(s, static_cast<int64_t>(nbytes), in, call)) return false;
  lengths.assign(static_cast<size_t>(size_), 0);
  *equal = true;
  for (int r = 0; r < size_; ++r) {
    lengths[r] = r == rank_ ? static_cast<int64_t>(nbytes) : arrival(r, s).value;
    *equal &= lengths[r] == static_cast<int64_t>(nbytes);
  }
  if (*equal && direct) {
    for (int r = 0; r < size_; ++r) copy_part(r, s, in, out + static_cast<size_t>(r) * nbytes, nbytes, call);
    close_step(s);
    wait_readers(s, call);
    return true;
  }
  if (*equal)
    for (int r = 0; r < size_; ++r) {
      char* to = out + static_cast<size_t>(r) * nbytes;
      const char* from = r == rank_ ? in : slot(r, s);
      if (to != from) std::memcpy(to, from, first);
    }
  close_step(s);
  if (!*equal || nbytes <= slot_) return true;
  std::vector<int64_t> offsets(static_cast<size_t>(size_)), rest(static_cast<size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) offsets[r] = static_cast<int64_t>(static_cast<size_t>(r) * nbytes + first);
  for (auto& n : rest) n = static_cast<int64_t>(nbytes - first);
  return gather_steps(in + first, out, offsets, rest, call);
}

bool HostMemory::reduce_scatter(const void* src, void* dst, const std::vector<int64_t>& starts,
                                const std::vector<int64_t>& counts, DType t, ReduceOp op, double factor,
                                HostCall& call) {
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  if (starts.size() != static_cast<size_t>(size_) || counts.size() != starts.size())
    throw std::invalid_argument("reduce_scatter: one start and one count per rank");
  if (t == DType::uint8) throw std::invalid_argument("no reductions for uint8");  // before any step
  const size_t es = dtype_size(t);
  auto* out = static_cast<char*>(dst);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) total = std::max(total, starts[r] + counts[r]);
  std::vector<char> copy;  // (in place: dst is this rank's part of src)
  const char* in = unless_overlapping(static_cast<const char*>(src), static_cast<size_t>(total) * es, out,
                                      static_cast<size_t>(counts[rank_]) * es,
                                      out - static_cast<size_t>(starts[rank_]) * es, copy);
  const int64_t per_step = static_cast<int64_t>(slot_ / es);
  const int64_t lo = starts[rank_], hi = starts[rank_] + counts[rank_];
  for (int64_t off = 0; off < total || off == 0; off += per_step) {
    const int64_t c = std::min(per_step, total - off);
    const uint64_t s = open_step(call);
    std::memcpy(slot(rank_, s), in + off * es, static_cast<size_t>(c) * es);
    if (!arrive(s, 0, call)) return false;
    const int64_t a = std::max(lo, off), b = std::min(hi, off + c);
    if (b > a) {  // our part of this step, reduced in rank order from every slot
      char* to = out + (a - lo) * es;
      std::memcpy(to, slot(0, s) + (a - off) * es, static_cast<size_t>(b - a) * es);
      for (int r = 1; r < size_; ++r) reduce_into(to, slot(r, s) + (a - off) * es, b - a, t, op);
    }
    close_step(s);
    if (total == 0) break;
  }
  if (factor != 1.0) scale(out, counts[rank_], t, factor);
  return true;
}

bool HostMemory::barrier(HostCall& call) {
  std::lock_guard<std::mutex> one_at_a_time(calls_);
  const uint64_t s = open_step(call);
  if (!arrive(s, 0, call)) return false;
  close_step(s);
  return true;
}

}  // namespace ddl
