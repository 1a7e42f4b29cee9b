#include "ddl/executor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ddl {

namespace {

constexpr size_t kHeaderBytes = 2 * sizeof(int64_t);
constexpr Handle kNotPosted = -1;
constexpr Handle kDone = -2;
constexpr Handle kArrived = -3;  // received, not yet applied (waits for the round's sends)

const char* kind_name(StepKind k) {
  switch (k) {
    case StepKind::send: return "send to";
    case StepKind::recv_reduce: return "receive (reduce) from";
    case StepKind::recv_copy: return "receive (copy) from";
  }
  return "?";
}

struct ActiveBlock {
  size_t index = 0;
  const Program* prog = nullptr;
  char* base = nullptr;     // the block's first byte in the user buffer
  char* scratch = nullptr;  // this slot's scratch (normal mode) or staging (header mode)
  Handle* handles = nullptr;  // this slot's row of the run's handles, one per step of the program
  size_t round = 0;
  size_t pending = 0;        // steps of this round not yet done
  size_t sends_pending = 0;  // sends of this round not yet complete
  int64_t round_start = 0;   // clock_ns() when this round began (recorded runs only)
  size_t rounds() const { return prog->round_begin.size() - 1; }
};

// A run's bookkeeping, kept by the thread between runs so that a small call allocates nothing (a run nested in
// another's hooks, were there one, gets its own).
struct RunScratch {
  std::vector<ActiveBlock> active;
  std::vector<size_t> free_slots, slot_of;
  std::vector<Handle> handles;
  bool busy = false;
};
thread_local RunScratch thread_scratch;

class Run {
 public:
  Run(Transport& t, const Plan& plan, char* buf, RunOptions& opt, std::vector<char>& arena,
      Clock::duration rest_longest, int64_t& rests, const std::atomic<int>& waiting)
      : t_(t), plan_(plan), buf_(buf), opt_(opt), es_(dtype_size(opt.dtype)), rest_longest_(rest_longest),
        rests_(rests), waiting_(waiting) {
    const int64_t half = std::max(1, t.max_tag() / 2);
    tag_base_ = opt.header_mode ? 0 : half;   // header and data messages never match each other
    tag_span_ = half;
    for (const Program& p : plan.programs) slot_bytes_ = std::max(slot_bytes_, slot_bytes(p));
    slots_ = static_cast<size_t>(std::max(1, plan.inflight));
    if (arena.size() < slots_ * slot_bytes_) arena.resize(slots_ * slot_bytes_);
    arena_ = arena.data();
    tiled_ = (opt.source != nullptr || opt.factor != 1.0) && tiles(plan, static_cast<size_t>(opt.bytes) / es_);
    if (opt.source != nullptr) {
      if (tiled_)
        source_ = static_cast<const char*>(opt.source);
      else if (opt.bytes > 0)
        std::memcpy(buf_, opt.source, static_cast<size_t>(opt.bytes));
    }
  }

  void go() {
    RunScratch own;
    RunScratch& scratch = thread_scratch.busy ? own : thread_scratch;
    scratch.busy = true;
    struct Release {
      RunScratch& s;
      ~Release() { s.busy = false; }
    } release{scratch};
    std::vector<ActiveBlock>& active = scratch.active;
    std::vector<size_t>& free_slots = scratch.free_slots;
    std::vector<size_t>& slot_of = scratch.slot_of;
    active.clear(), free_slots.clear(), slot_of.clear();
    for (size_t s = slots_; s-- > 0;) free_slots.push_back(s);
    size_t steps = 0;
    for (const Program& p : plan_.programs) steps = std::max(steps, p.steps.size());
    scratch.handles.resize(slots_ * steps);
    handles_ = scratch.handles.data(), steps_ = steps;
    size_t next = 0;
    // (the clock is read once the run waits: a call whose messages are there when it begins never reads it)
    bool moved = true;  // progress since the clock was last read: last_progress is the first wait after it
    Clock::time_point last_progress, idle_deadline;
    BlockHooks* hooks = opt_.hooks;
    while (true) {
      bool progressed = false;
      while (next < plan_.blocks.size() && !free_slots.empty() && (!hooks || hooks->ready(next))) {
        active.push_back(start_block(next++, free_slots.back()));
        slot_of.push_back(free_slots.back());
        free_slots.pop_back();
        progressed = true;
      }
      if (active.empty() && next == plan_.blocks.size() && t_.settled()) break;
      t_.poll();
      t_.settled();  // (the run's check, compared as soon as it has come: a rank that waits on data may never)
      if (!t_.mismatch().empty()) throw CallMismatch(t_.mismatch());
      for (size_t i = 0; i < active.size();) {
        progressed |= advance(active[i]);
        if (active[i].round == active[i].rounds()) {
          if (opt_.factor != 1.0 && tiled_) scale(active[i].base, active[i].prog->extent, opt_.dtype, opt_.factor);
          if (hooks) hooks->finished(active[i].index);
          free_slots.push_back(slot_of[i]);
          active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
          slot_of.erase(slot_of.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (progressed) {
        moved = true;
      } else {
        const auto now = Clock::now();
        if (moved) last_progress = now, idle_deadline = now + timeout(), moved = false;
        if (now > idle_deadline) fail(active, next);
        const bool waited_for = waiting_.load(std::memory_order_relaxed) > 0;
        const auto rest = waited_for ? Clock::duration::zero() : std::min(rest_longest_, (now - last_progress) / 8);
        if (rest > Clock::duration::zero()) ++rests_;
        // (blocks still to start wait on their hooks: not only on messages)
        t_.idle(rest, hooks == nullptr || next == plan_.blocks.size());
      }
    }
    if (opt_.factor != 1.0 && !tiled_) scale(buf_, opt_.bytes / static_cast<int64_t>(es_), opt_.dtype, opt_.factor);
  }

 private:
  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.timeout_s));
  }

  size_t message_bytes(const Step& s) const {
    size_t data = static_cast<size_t>(s.count) * es_;
    if (!opt_.header_mode) return data;
    if (s.kind != StepKind::send) data = std::max(data, static_cast<size_t>(opt_.header_capacity));
    return kHeaderBytes + data;
  }

  // Normal mode: scratch for receives that reduce. Header mode: a staging area per step.
  size_t slot_bytes(const Program& p) const {
    if (!opt_.header_mode) return static_cast<size_t>(p.scratch_elems) * es_;
    size_t total = 0;
    for (const Step& s : p.steps) total += message_bytes(s);
    return total;
  }

  char* stage(ActiveBlock& a, size_t i) {  // header mode: staging of step i
    size_t off = 0;
    for (size_t j = 0; j < i; ++j) off += message_bytes(a.prog->steps[j]);
    return a.scratch + off;
  }

  int tag_for(const ActiveBlock& a, const Step& s) const {
    int64_t seq = static_cast<int64_t>(a.index) * a.prog->tags + s.tag;
    return static_cast<int>(tag_base_ + seq % tag_span_);
  }

  // Whether the blocks, in order, cover [0, elems) end to end, each its program's extent.
  static bool tiles(const Plan& plan, size_t elems) {
    int64_t end = 0;
    for (const Block& b : plan.blocks) {
      if (b.offset != end) return false;
      end += plan.programs[static_cast<size_t>(b.program)].extent;
    }
    return end == static_cast<int64_t>(elems);
  }

  ActiveBlock start_block(size_t index, size_t slot) {
    ActiveBlock a;
    a.index = index;
    const Block& b = plan_.blocks[index];
    a.prog = &plan_.programs[static_cast<size_t>(b.program)];
    a.base = buf_ + static_cast<size_t>(b.offset) * es_;
    if (source_ != nullptr && a.prog->extent > 0)
      std::memcpy(a.base, source_ + static_cast<size_t>(b.offset) * es_, static_cast<size_t>(a.prog->extent) * es_);
    a.scratch = arena_ + slot * slot_bytes_;
    a.handles = handles_ + slot * steps_;
    std::fill_n(a.handles, a.prog->steps.size(), kNotPosted);
    for (size_t i = 0; i < a.prog->steps.size(); ++i) {  // post early what cannot conflict
      const Step& s = a.prog->steps[i];
      if (s.kind == StepKind::send) continue;
      if (opt_.header_mode) {
        a.handles[i] = t_.irecv(stage(a, i), message_bytes(s), s.peer, tag_for(a, s));
      } else if (s.scratch >= 0) {
        a.handles[i] = t_.irecv(a.scratch + static_cast<size_t>(s.scratch) * es_, message_bytes(s), s.peer,
                                tag_for(a, s));
      }
    }
    start_round(a);
    return a;
  }

  void start_round(ActiveBlock& a) {
    if (a.round >= a.rounds()) return;
    if (opt_.spans) a.round_start = clock_ns();
    size_t lo = a.prog->round_begin[a.round], hi = a.prog->round_begin[a.round + 1];
    a.sends_pending = 0;
    for (size_t i = lo; i < hi; ++i) {
      const Step& s = a.prog->steps[i];
      char* data = a.base + static_cast<size_t>(s.offset) * es_;
      if (s.kind == StepKind::send) {
        if (opt_.header_mode) {
          char* st = stage(a, i);
          std::memcpy(st, opt_.header, kHeaderBytes);
          std::memcpy(st + kHeaderBytes, data, static_cast<size_t>(s.count) * es_);
          data = st;
        }
        a.handles[i] = t_.isend(data, message_bytes(s), s.peer, tag_for(a, s));
        ++a.sends_pending;
      } else if (a.handles[i] == kNotPosted) {
        a.handles[i] = t_.irecv(data, message_bytes(s), s.peer, tag_for(a, s));
      }
    }
    a.pending = hi - lo;
  }

  void finish(ActiveBlock& a, size_t i) {
    const Step& s = a.prog->steps[i];
    if (s.kind == StepKind::send) return;
    char* dst = a.base + static_cast<size_t>(s.offset) * es_;
    const char* src = a.scratch + static_cast<size_t>(s.scratch) * es_;
    if (opt_.header_mode) {
      const char* st = stage(a, i);
      int64_t h[2];
      std::memcpy(h, st, kHeaderBytes);
      opt_.header[0] = std::max(opt_.header[0], h[0]);
      opt_.header[1] = std::max(opt_.header[1], h[1]);
      src = st + kHeaderBytes;
    }
    if (s.count == 0) return;  // a header-only message
    if (s.kind == StepKind::recv_copy && (opt_.header_mode || s.scratch >= 0))
      std::memcpy(dst, src, static_cast<size_t>(s.count) * es_);
    if (s.kind == StepKind::recv_reduce) reduce_into(dst, src, s.count, opt_.dtype, opt_.op);
  }

  bool advance(ActiveBlock& a) {
    bool progressed = false;
    while (a.round < a.rounds()) {
      size_t lo = a.prog->round_begin[a.round], hi = a.prog->round_begin[a.round + 1];
      for (size_t i = lo; i < hi; ++i) {
        Handle h = a.handles[i];
        if (h == kDone || h == kArrived || !t_.test(h)) continue;
        progressed = true;
        if (a.prog->steps[i].kind == StepKind::send) {
          a.handles[i] = kDone;
          --a.sends_pending;
          --a.pending;
        } else {
          a.handles[i] = kArrived;
        }
      }
      for (size_t i = lo; i < hi; ++i) {  // apply what arrived, once the sends it must follow are done
        const Step& s = a.prog->steps[i];
        if (a.handles[i] != kArrived || (s.wait_sends && a.sends_pending && !opt_.header_mode)) continue;
        finish(a, i);
        a.handles[i] = kDone;
        --a.pending;
        progressed = true;
      }
      if (a.pending) return progressed;
      if (opt_.spans)
        opt_.spans->push_back({static_cast<int64_t>(a.index), static_cast<int64_t>(a.round), a.round_start,
                               clock_ns()});
      ++a.round;
      progressed = true;
      start_round(a);
    }
    return progressed;
  }

  [[noreturn]] void fail(const std::vector<ActiveBlock>& active, size_t next) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", opt_.timeout_s);
    std::string what = "rank " + std::to_string(t_.rank()) + ": " + opt_.label + " made no progress for " +
                       seconds + " s (DDL_TIMEOUT)";
    if (active.empty() && next == plan_.blocks.size())
      throw TransportError(what + "; waiting for rank " + std::to_string((t_.rank() + t_.size() - 1) % t_.size()) +
                           " to say which call it made");
    if (active.empty())
      throw TransportError(what + "; block " + std::to_string(next) + "'s data never became ready (a copy from "
                           "the GPU did not finish)");
    for (const ActiveBlock& a : active) {
      size_t lo = a.prog->round_begin[a.round], hi = a.prog->round_begin[a.round + 1];
      for (size_t i = lo; i < hi; ++i) {
        if (a.handles[i] == kDone) continue;
        const Step& s = a.prog->steps[i];
        what += "; waiting on " + std::string(kind_name(s.kind)) + " rank " + std::to_string(s.peer) + " (" +
                std::to_string(message_bytes(s)) + " bytes, round " + std::to_string(s.round) + ", block " +
                std::to_string(a.index) + ")";
        goto named;
      }
    }
  named:
    what += ". The peer may have died, or ranks called different collectives.";
    throw TransportError(what);
  }

  Transport& t_;
  const Plan& plan_;
  char* buf_;
  RunOptions& opt_;
  size_t es_;
  Clock::duration rest_longest_;  // zero: this run never rests
  int64_t& rests_;
  const std::atomic<int>& waiting_;  // callers waiting for a submitted run: rest no more
  int64_t tag_base_ = 0, tag_span_ = 1;
  size_t slot_bytes_ = 0, slots_ = 1;
  char* arena_ = nullptr;
  Handle* handles_ = nullptr;  // slots_ rows of steps_ (RunScratch)
  size_t steps_ = 0;
  const char* source_ = nullptr;  // out of place, copied block by block (RunOptions::source)
  bool tiled_ = false;            // the blocks cover the buffer end to end (source and factor: block by block)
};

}  // namespace

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::vector<RoundSpan> Executor::take_spans(int64_t* dropped) {
  std::vector<RoundSpan> out;
  out.swap(spans_);
  if (dropped) *dropped = dropped_;
  dropped_ = 0;
  return out;
}

std::vector<RunRecord> Executor::runs() const {
  std::vector<RunRecord> out;
  for (const RunRecord& r : ring_)
    if (r.seq >= 0) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const RunRecord& a, const RunRecord& b) { return a.seq < b.seq; });
  return out;
}

Program make_program(const int64_t* rows, size_t nrows, int64_t scratch_elems, int32_t tags) {
  Program p;
  p.scratch_elems = scratch_elems;
  p.tags = std::max(1, tags);
  p.steps.reserve(nrows);
  int32_t last_round = -1;
  for (size_t i = 0; i < nrows; ++i) {
    const int64_t* r = rows + kStepFields * i;
    Step s{static_cast<StepKind>(r[0]), static_cast<int32_t>(r[1]), static_cast<int32_t>(r[2]),
           static_cast<int32_t>(r[3]), r[4], r[5], r[6], static_cast<int32_t>(r[7])};
    if (s.kind != StepKind::send && s.kind != StepKind::recv_reduce && s.kind != StepKind::recv_copy)
      throw std::invalid_argument("step " + std::to_string(i) + ": unknown kind " + std::to_string(r[0]));
    if (s.round < last_round) throw std::invalid_argument("steps must be sorted by round");
    if ((s.kind == StepKind::recv_reduce && s.scratch < 0) || (s.scratch >= 0 && s.scratch + s.count > scratch_elems))
      throw std::invalid_argument("step " + std::to_string(i) + ": scratch range outside the block's scratch");
    if (s.count < 0 || s.offset < 0 || s.tag < 0 || s.tag >= p.tags)
      throw std::invalid_argument("step " + std::to_string(i) + ": negative range or tag out of bounds");
    while (last_round < s.round) {  // open every round up to this one (rounds may be empty here)
      p.round_begin.push_back(i);
      ++last_round;
    }
    p.steps.push_back(s);
    p.extent = std::max(p.extent, s.offset + s.count);
  }
  p.round_begin.push_back(nrows);
  return p;
}

bool Executor::run_small(const Plan& plan, const void* src, void* dst, size_t nbytes, double factor,
                         RunOptions& opt) {
  const int64_t mine[2] = {opt.header[0], opt.header[1]};
  if (small_.size() < nbytes) small_.resize(nbytes);
  if (nbytes) std::memcpy(small_.data(), src, nbytes);
  run(plan, small_.data(), opt);
  if (opt.header[0] != mine[0] || opt.header[1] != mine[1]) return false;
  if (factor != 1.0) scale(small_.data(), static_cast<int64_t>(nbytes / dtype_size(opt.dtype)), opt.dtype, factor);
  if (nbytes) std::memcpy(dst, small_.data(), nbytes);
  return true;
}

void Executor::run(const Plan& plan, void* buf, RunOptions& opt) {
  if (!broken_.empty())
    throw TransportError("this communicator is unusable after an earlier failure (" + broken_ +
                         "); call ddl.finalize() and ddl.init() to recreate it");
  if (recording_) opt.spans = &spans_;
  const size_t before = spans_.size();
  RunRecord* rec = nullptr;
  if (!ring_.empty()) {
    rec = &ring_[static_cast<size_t>(runs_ % static_cast<int64_t>(ring_.size()))];
    rec->seq = runs_++;
    rec->bytes = opt.bytes;
    rec->end_ns = 0;
    rec->state = 0;
    rec->label.assign(opt.label);
    rec->start_ns = clock_ns();
  }
  try {
    const bool resting = rest_longest_ > Clock::duration::zero() && opt.bytes >= rest_from_;
    t_->begin_run(opt.check, opt.label, opt.timeout_s, opt.bytes);
    Run(*t_, plan, static_cast<char*>(buf), opt, arena_, resting ? rest_longest_ : Clock::duration::zero(), rests_,
        waiting_)
        .go();
    t_->end_run();
    if (rec) rec->end_ns = clock_ns(), rec->state = 1;
    if (spans_.size() > kMaxSpans) {  // nobody took them: keep the oldest, count the rest
      dropped_ += static_cast<int64_t>(spans_.size() - std::max(before, kMaxSpans));
      spans_.resize(std::max(before, kMaxSpans));
    }
  } catch (const CallMismatch&) {  // ranks called differently: this run is dropped, the transport goes on
    if (rec) rec->end_ns = clock_ns(), rec->state = 2;
    t_->abandon_run();
    throw;
  } catch (const std::exception& e) {
    if (rec) rec->end_ns = clock_ns(), rec->state = 2;
    // Whatever stopped the run, messages of it may still be posted: cancel them and refuse further runs,
    // so nothing lands later in memory the caller has reused.
    t_->abandon();
    broken_ = e.what();
    throw;
  }
}

}  // namespace ddl
