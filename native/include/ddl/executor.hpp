// Executes a compiled schedule on a contiguous buffer. It makes no choices: the Python planner decides the
// steps, the blocks (pipeline segments) and how many blocks are in flight; this only moves and reduces bytes.
//
// Terms. A *program* is one rank's ordered steps for one block size; steps carry a round number and a
// round's steps touch disjoint bytes, so they run concurrently. A *block* is a slice of the buffer run through
// one program; up to `inflight` blocks run at once, so reducing one block overlaps the transfer of the next.
// Receives that reduce land in per-block scratch and are posted when the block starts (early), because no
// earlier step can conflict with scratch; receives that copy are posted when their round starts.
//
// Header mode (small collectives): every message is [16-byte header | data]. The header is two int64 that
// every receive merges by max, so after the collective each rank holds max and -min of a value the Python
// side put there (the hash of the call's signature): agreement is checked in the same messages as the data.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddl/reduce.hpp"
#include "ddl/transport.hpp"

namespace ddl {

enum class StepKind : int32_t { send = 0, recv_reduce = 1, recv_copy = 2 };

struct Step {
  StepKind kind;
  int32_t peer;
  int32_t round;
  int32_t tag;      // index of this message within the block; sender and receiver compute the same one
  int64_t offset;   // elements from the block start
  int64_t count;    // elements
  int64_t scratch;  // elements from the block's scratch start: where a recv_reduce (or a staged
                    // recv_copy) lands; -1 for a copy received straight into the buffer
  int32_t wait_sends;  // apply only after this round's sends completed (they read the range it writes)
};

// A step crosses from Python as one row of int64, one per field of Step, in this order; Python reads the order
// from here (ddl._native.STEP_FIELDS) and the kind codes from StepKind, so the layout is declared only here.
inline constexpr const char* kStepFieldNames[] = {"kind",   "peer",  "round",   "tag",
                                                  "offset", "count", "scratch", "wait_sends"};
inline constexpr size_t kStepFields = sizeof(kStepFieldNames) / sizeof(kStepFieldNames[0]);

struct Program {
  std::vector<Step> steps;          // sorted by round
  std::vector<size_t> round_begin;  // steps of round r: [round_begin[r], round_begin[r + 1])
  int64_t scratch_elems = 0;
  int32_t tags = 1;                 // distinct tags one block uses
  int64_t extent = 0;               // elements from the block start its steps reach
};

struct Block {
  int64_t offset;  // elements
  int32_t program;
};

struct Plan {
  std::vector<Program> programs;
  std::vector<Block> blocks;
  int32_t inflight = 1;
};

// Optional gates around each block, for data that arrives and leaves asynchronously (the GPU path stages each
// block through pinned host memory): a block starts only once ready() says its bytes are in place, in block
// order; finished() runs as soon as its last step is done, while later blocks are still moving.
struct BlockHooks {
  virtual ~BlockHooks() = default;
  virtual bool ready(size_t block) = 0;
  virtual void finished(size_t block) = 0;
};

// One round of one pipeline block as the executor ran it, on the steady clock (clock_ns): from the round's
// first post to its last completion. The timeline and the per-level -dump_iter are made of these; Python knows
// which level and phase each round belongs to. Recording costs nothing when off (one pointer test per round).
struct RoundSpan {
  int64_t block;
  int64_t round;
  int64_t start_ns;
  int64_t end_ns;
};
int64_t clock_ns();

struct RunOptions {
  DType dtype = DType::float32;
  ReduceOp op = ReduceOp::sum;
  double timeout_s = 300.0;       // fail after this long without any completion
  bool header_mode = false;
  int64_t header[2] = {0, 0};      // in: this rank's value; out: merged by max
  int64_t header_capacity = 0;     // header mode: bytes of data a receive must accept
  std::string label = "collective";
  BlockHooks* hooks = nullptr;     // not owned
  std::vector<RoundSpan>* spans = nullptr;  // when set, one span per block round is appended (not owned)
  int64_t bytes = 0;               // the buffer's size, for the flight recorder
  int64_t check = 0;               // nonzero: the call's hash, checked on receipt (Transport::begin_run)
  // Out of place: the caller's input (bytes elements' worth, not overlapping the buffer). Each block copies its
  // range in as it starts where the blocks tile the buffer, so the copy overlaps the blocks before it on the
  // wire instead of delaying the first; otherwise it is copied whole before the run.
  const void* source = nullptr;
  // Each element times this once the run is done with it (an average's 1/n): block by block as each block
  // finishes where the blocks tile the buffer, else over the whole buffer after the run.
  double factor = 1.0;
};

// One run as the flight recorder keeps it (ddl.core.flight): its number on this executor (the same run has
// the same number on every rank), label, bytes, start and end on clock_ns, and how it ended.
struct RunRecord {
  int64_t seq = -1, bytes = 0, start_ns = 0, end_ns = 0;
  int32_t state = 0;  // 0 running, 1 done, 2 failed
  std::string label;
};

// Builds a Program from rows of kStepFields int64 (kStepFieldNames' order), sorted by round.
Program make_program(const int64_t* rows, size_t nrows, int64_t scratch_elems, int32_t tags);

// Runs plans over one transport. Keeps its scratch between runs; after a TransportError it refuses to run
// again, because messages of the failed run may still be in flight (recreate the communicator instead).
class Executor {
 public:
  explicit Executor(std::shared_ptr<Transport> t) : t_(std::move(t)) {}
  void run(const Plan& plan, void* buf, RunOptions& opt);
  // A header-mode run on a private copy of src: if every rank's header agreed with this one's, the result is
  // scaled by `factor` (1 for none) and written to dst (which may be src); otherwise dst is left untouched.
  // Returns whether they agreed. One call for a whole small collective: its cost is latency, not bytes.
  bool run_small(const Plan& plan, const void* src, void* dst, size_t nbytes, double factor, RunOptions& opt);
  Transport& transport() { return *t_; }
  bool broken() const { return !broken_.empty(); }
  // While recording, every run appends its rounds' spans; take_spans() hands them over and clears. A
  // bounded buffer: past kMaxSpans the oldest are kept and the rest counted as dropped.
  void record(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  std::vector<RoundSpan> take_spans(int64_t* dropped = nullptr);
  static constexpr size_t kMaxSpans = size_t{1} << 22;
  // The flight recorder: the last n runs in a ring (0: none). Two clock reads and a string copy per run.
  void keep_runs(size_t n) { ring_.assign(n, RunRecord{}); }
  // Runs of at least `from_bytes` rest between polls once they wait, while no caller waits for them: an
  // eighth of the time since anything last completed, at most `longest` (zero: never). Such a run's waits
  // are long, on a slow link or behind ranks that share cores; a rest gives the core to the caller's work
  // beside it (backward) and delays noticing a completion by that eighth and the oversleep Linux adds (the
  // timer slack, 50 us, and more where cores are shared). A smaller run, and any run while a caller waits
  // (caller_waits: a blocking call's own thread, or one waiting for a submitted call), keep polling: then
  // nothing of the caller's needs the core, and the wait is the caller's time.
  void rest(Clock::duration longest, int64_t from_bytes) { rest_longest_ = longest, rest_from_ = from_bytes; }
  // A caller starts or stops waiting for this executor's runs; counted, as several threads may wait.
  void caller_waits(bool on) { waiting_.fetch_add(on ? 1 : -1, std::memory_order_relaxed); }
  int64_t rests() const { return rests_; }  // rests taken so far (a count: what the tests can check)
  std::vector<RunRecord> runs() const;  // oldest first

 private:
  std::shared_ptr<Transport> t_;
  std::vector<char> arena_, small_;
  Clock::duration rest_longest_{};
  int64_t rest_from_ = 0;
  int64_t rests_ = 0;
  std::atomic<int> waiting_{0};
  std::string broken_;
  bool recording_ = false;
  std::vector<RoundSpan> spans_;
  int64_t dropped_ = 0;
  std::vector<RunRecord> ring_;
  int64_t runs_ = 0;
};

}  // namespace ddl
