// A communicator's short paths on the host memory level (or in a job of one rank), each found and run in one
// native call; across hosts (ddl's TCP), the known calls whose plan and options are the same every time (a
// broadcast or an allreduce checked on receipt; an allreduce, an allgather or a reduce-scatter riding in the
// agreement round), run on the executor the same way.
//
// Python checks a call the first time it sees its signature (its refusals and their messages live there) and
// then teaches this table the signature: the dtype object (held here, so its address cannot come back as another
// dtype's), the shape, and the root or op. A later call of that signature on plain C-contiguous numpy arrays runs
// from here: the lookup, the output and the native collective cost a few hundred nanoseconds, where the same
// steps in Python cost about a microsecond, more than the collective itself between two ranks. Anything else
// (another array type, a dtype object that is equal but not the same, an out to check) returns None and takes
// Python's path, which gives the same answers.
//
// A call returns its result, None (not here: Python's path) or, for an allgather whose rows turned out uneven,
// every rank's length in bytes with the call's text and hash (Python gathers them). Where ranks called
// differently it hands the call's text to Python's on_mismatch (which reports it, collectively, and raises); a
// transport failure goes through Python's on_failure (which names it: the dead rank kept, a deadline's absent
// ranks) before it is raised. So the caller's Python is three lines for every collective.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

#include "ddl/executor.hpp"
#include "ddl/host_calls.hpp"
#include "ddl/host_memory.hpp"
#include "ddl/python_run.hpp"
#include "ddl/reduce.hpp"
#include "ddl/transport.hpp"

namespace py = pybind11;
using namespace ddl;

namespace {

constexpr int kMaxDims = 8;
constexpr size_t kMaxEntries = 256;  // as Python's signature caches: a job making ever new shapes stays bounded
enum class Kind : int { broadcast, allgather, allreduce, reduce_scatter };
using Shape = std::vector<py::ssize_t>;

struct Key {
  const PyObject* dtype = nullptr;
  Kind kind = Kind::broadcast;
  int ndim = 0;
  int64_t root = 0;
  std::array<py::ssize_t, kMaxDims> shape{};
  std::array<char, 16> op{};
  bool operator==(const Key& o) const {
    return dtype == o.dtype && kind == o.kind && ndim == o.ndim && root == o.root && shape == o.shape && op == o.op;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.dtype) ^ (static_cast<size_t>(k.kind) << 56) ^ static_cast<size_t>(k.root);
    for (int i = 0; i < k.ndim; ++i) h = h * 1000003u ^ static_cast<size_t>(k.shape[static_cast<size_t>(i)]);
    for (char c : k.op) h = h * 31u + static_cast<unsigned char>(c);
    return h;
  }
};

// A known call's planned run on the executor, as Python made it on the first call: its Pipeline and RunOptions
// (held), and Python's way of naming a transport failure of it (failed(error) returns the error to raise).
struct PlannedRun {
  py::object plan_object, options_object, failed;
  const PyPlan* plan = nullptr;
  const PyRunOptions* options = nullptr;
  std::vector<char> own;  // a checked run's buffer of its own: out is written once the ranks' calls agreed
  // a ride with a layout of its own (an allgather's parts, a reduce-scatter's whole): the Ride's buffer (held),
  // where the input's pieces go in it (buffer byte, input byte, bytes), where the answer lies, and Python's
  // answer where the round did not agree (None: ranks called differently, on_mismatch raises)
  py::object buffer_object, disagreed;
  char* buffer = nullptr;
  std::vector<std::array<size_t, 3>> pieces;
  size_t answer_at = 0;
  std::vector<std::array<size_t, 3>> answer_pieces;  // or the answer's pieces (buffer byte, output byte, bytes)
};

struct Entry {
  py::object dtype;  // keeps the key's dtype object alive
  Kind kind;
  Shape result;      // the output's shape
  size_t in_bytes = 0, out_bytes = 0;
  HostCall call;     // broadcast, allgather
  HostAllreduce allreduce{};
  HostReduceScatter reduce_scatter{};
  std::shared_ptr<PlannedRun> planned;  // across hosts: the run on the executor (no host level)
  HostCall& host_call() {
    return kind == Kind::allreduce ? allreduce.call : kind == Kind::reduce_scatter ? reduce_scatter.call : call;
  }
  const std::string& label() { return planned ? planned->options->label : host_call().label; }
};
using EntryPtr = std::shared_ptr<Entry>;  // a call holds its entry: another thread may clear the table meanwhile

// A plain numpy array's parts, read from its struct: no buffer request, no attribute lookups.
struct View {
  PyObject* dtype;
  int ndim;
  const py::ssize_t* shape;
  char* data;
  int flags;
};

bool view_of(py::handle obj, View* v) {
  if (Py_TYPE(obj.ptr()) != py::detail::npy_api::get().PyArray_Type_) return false;  // subclasses: Python's path
  const auto* a = py::detail::array_proxy(obj.ptr());
  if (a->nd > kMaxDims) return false;
  *v = View{a->descr, a->nd, a->dimensions, a->data, a->flags};
  return true;
}

constexpr int kContiguous = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_;
constexpr int kWritable = py::detail::npy_api::NPY_ARRAY_WRITEABLE_;

bool same_shape(const View& v, const Shape& shape) {
  return static_cast<size_t>(v.ndim) == shape.size() && std::equal(shape.begin(), shape.end(), v.shape);
}

bool op_name(py::handle op, std::array<char, 16>* name) {
  if (!PyUnicode_CheckExact(op.ptr())) return false;
  Py_ssize_t n = 0;
  const char* text = PyUnicode_AsUTF8AndSize(op.ptr(), &n);
  if (!text || n >= static_cast<Py_ssize_t>(name->size()) || std::memchr(text, 0, static_cast<size_t>(n))) {
    PyErr_Clear();  // (a name with a NUL in it would pad to a known one)
    return false;
  }
  std::memcpy(name->data(), text, static_cast<size_t>(n));
  return true;
}

class ShortCalls {
 public:
  // host: the communicator's HostMemory, or None for a job of one rank (each collective is then a copy) or one
  // across hosts (executor: its Executor, whose planned runs are learnt by learn_planned_*).
  // on_mismatch(text) raises ranks' calls' differences; on_failure(error, text) returns the error to raise.
  ShortCalls(py::object host, py::object on_mismatch, py::object on_failure, py::object executor)
      : owner_(std::move(host)),
        host_(owner_.is_none() ? nullptr : &owner_.cast<HostMemory&>()),
        executor_owner_(std::move(executor)),
        executor_(executor_owner_.is_none() ? nullptr : &executor_owner_.cast<Executor&>()),
        on_mismatch_(std::move(on_mismatch)),
        on_failure_(std::move(on_failure)) {}

  // A known call's planned run (plan: a Pipeline, options: its RunOptions; an allreduce's with a header rides in
  // the agreement round, one without is checked on receipt, as a broadcast is): later calls run it from here.
  void learn_planned_broadcast(py::object dtype, const Shape& shape, int root, py::object plan,
                               py::object options, py::object failed) {
    Entry e = entry(dtype, Kind::broadcast, shape, shape);
    if (planned(&e, std::move(plan), std::move(options), std::move(failed)) && !e.planned->options->header)
      remember(key(dtype, Kind::broadcast, shape, root, {}), std::move(e));
  }
  void learn_planned_allreduce(py::object dtype, const Shape& shape, py::handle op, py::object plan,
                               py::object options, py::object failed) {
    std::array<char, 16> name{};
    Entry e = entry(dtype, Kind::allreduce, shape, shape);
    if (op_name(op, &name) && planned(&e, std::move(plan), std::move(options), std::move(failed)))
      remember(key(dtype, Kind::allreduce, shape, 0, name), std::move(e));
  }
  // A known allgather (op None) or reduce-scatter riding in the agreement round with its layout (see PlannedRun),
  // or an allgather's plan checked on receipt (options without a header) on a buffer of its own laid out alike:
  // later calls put their pieces into `buffer`, run the round or the plan on it and copy the answer out.
  void learn_ride(py::object dtype, const Shape& shape, py::handle op, const Shape& result, py::object plan,
                  py::object options, py::array buffer, const std::vector<std::array<size_t, 3>>& pieces,
                  size_t answer_at, py::object failed, py::object disagreed,
                  const std::vector<std::array<size_t, 3>>& answer_pieces) {
    std::array<char, 16> name{};
    const Kind kind = op.is_none() ? Kind::allgather : Kind::reduce_scatter;
    if (kind == Kind::reduce_scatter && !op_name(op, &name)) return;
    Entry e = entry(dtype, kind, shape, result);
    const auto bytes = static_cast<size_t>(buffer.nbytes());
    if (!(buffer.flags() & kContiguous) || !buffer.writeable() || answer_at + e.out_bytes > bytes) return;
    for (const auto& [at, from, n] : pieces)
      if (at + n > bytes || from + n > e.in_bytes) return;
    size_t answered = 0;
    for (const auto& [at, to, n] : answer_pieces) {
      if (at + n > bytes || to + n > e.out_bytes) return;
      answered += n;
    }
    if (!answer_pieces.empty() && answered != e.out_bytes) return;
    // (an allgather's run may be checked on receipt instead: no header, a mismatch raises in the run)
    if (!planned(&e, std::move(plan), std::move(options), std::move(failed), bytes) ||
        !(e.planned->options->header || kind == Kind::allgather))
      return;
    PlannedRun& p = *e.planned;
    p.buffer = static_cast<char*>(buffer.mutable_data());
    p.buffer_object = std::move(buffer), p.pieces = pieces, p.answer_at = answer_at, p.answer_pieces = answer_pieces;
    p.disagreed = std::move(disagreed);
    remember(key(dtype, kind, shape, 0, name), std::move(e));
  }

  void learn_broadcast(py::object dtype, const Shape& shape, int root, const HostCall& call) {
    if (executor_) return;  // (across hosts: planned runs only)
    Entry e = entry(dtype, Kind::broadcast, shape, shape);
    e.call = call;
    e.call.run_ahead = true;  // every rank has made this call before: a small one need not wait for all
    remember(key(dtype, Kind::broadcast, shape, root, {}), std::move(e));
  }
  void learn_allgather(py::object dtype, const Shape& shape, const Shape& gathered, const HostCall& call) {
    if (executor_) return;  // (across hosts: planned runs only)
    Entry e = entry(dtype, Kind::allgather, shape, gathered);
    e.call = call;
    remember(key(dtype, Kind::allgather, shape, 0, {}), std::move(e));
  }
  // (prepared: None in a job of one rank)
  void learn_allreduce(py::object dtype, const Shape& shape, py::handle op,
                       const std::optional<HostAllreduce>& prepared) {
    std::array<char, 16> name{};
    if (executor_ || !op_name(op, &name) || !(prepared || !host_)) return;
    Entry e = entry(dtype, Kind::allreduce, shape, shape);
    if (prepared) e.allreduce = *prepared;
    remember(key(dtype, Kind::allreduce, shape, 0, name), std::move(e));
  }
  void learn_reduce_scatter(py::object dtype, const Shape& shape, py::handle op, const Shape& part,
                            const std::optional<HostReduceScatter>& prepared) {
    std::array<char, 16> name{};
    if (executor_ || !op_name(op, &name) || !(prepared || !host_)) return;
    Entry e = entry(dtype, Kind::reduce_scatter, shape, part);
    if (prepared) e.reduce_scatter = *prepared;
    remember(key(dtype, Kind::reduce_scatter, shape, 0, name), std::move(e));
  }
  void learn_barrier(const HostCall& call) { barrier_ = std::make_shared<HostCall>(call); }

  py::object broadcast(py::handle array, py::handle root_object, py::handle out) {
    // (a root that is not a plain int, or out of range, is never known here: Python refuses it on every rank)
    if (!PyLong_CheckExact(root_object.ptr())) return py::none();
    const long root_value = PyLong_AsLong(root_object.ptr());
    if (root_value == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return py::none();
    }
    const int root = static_cast<int>(root_value);
    View in{}, to{};
    const auto e = root == root_value ? find(array, Kind::broadcast, root, {}, &in) : nullptr;
    if (!e) return py::none();
    if (e->planned) return planned_broadcast(*e, in, out, root);
    if (out.ptr() == array.ptr()) {  // in place: the usual form
      if (!(in.flags & kWritable)) return py::none();
      if (!host_) return py::reinterpret_borrow<py::object>(out);
      return run(*e, out, [&] { return host_->broadcast(in.data, e->in_bytes, root, e->call); });
    }
    py::object dst = output(*e, out, &to);
    if (!dst) return py::none();
    // out of place: root sends from the input (only read) and copies it to out; the others receive into out
    const bool mine = !host_ || host_->rank() == root;
    return run(*e, dst, [&] {
      const bool agreed = !host_ || host_->broadcast(mine ? in.data : to.data, e->in_bytes, root, e->call);
      if (agreed && mine && to.data != in.data) std::memmove(to.data, in.data, e->in_bytes);
      return agreed;
    });
  }

  py::object allgather(py::handle array, py::handle out) {
    View in{}, to{};
    const auto e = find(array, Kind::allgather, 0, {}, &in);
    py::object dst = e ? output(*e, out, &to) : py::object();
    if (!dst) return py::none();
    if (e->planned) return ride(*e, in, to, dst, array, out);
    if (!host_) return alone(*e, in, to, dst);
    std::vector<int64_t> lengths;
    bool equal = false;
    const bool agreed = guarded(e->call.label, [&] {
      return host_->allgather_equal(in.data, to.data, e->in_bytes, lengths, &equal, e->call);
    });
    if (!agreed) return py::none();
    return equal ? dst : py::make_tuple(lengths, e->call.label, e->call.hash);
  }

  py::object allreduce(py::handle array, py::handle op, py::handle out) {
    View in{}, to{};
    py::object dst;
    const auto e = reduction(array, Kind::allreduce, op, out, &in, &to, &dst);
    if (!e) return py::none();
    if (e->planned) return planned_allreduce(*e, in, to, out.is_none(), dst);
    if (!host_) return alone(*e, in, to, dst);
    HostAllreduce& a = e->allreduce;
    return run(*e, dst, [&] {
      return host_->allreduce(in.data, to.data, static_cast<int64_t>(e->in_bytes / dtype_size(a.dtype)), a.dtype,
                              a.op, a.factor, a.one_phase, a.call);
    });
  }

  py::object reduce_scatter(py::handle array, py::handle op, py::handle out) {
    View in{}, to{};
    py::object dst;
    const auto e = reduction(array, Kind::reduce_scatter, op, out, &in, &to, &dst);
    if (!e) return py::none();
    if (e->planned) return ride(*e, in, to, dst, array, out);
    if (!host_) return alone(*e, in, to, dst);
    HostReduceScatter& p = e->reduce_scatter;
    return run(*e, dst, [&] {
      return host_->reduce_scatter(in.data, to.data, p.starts, p.counts, p.dtype, p.op, p.factor, p.call);
    });
  }

  // True once every rank arrived, None before Python's first.
  py::object barrier() {
    const auto call = barrier_;
    if (!call) return py::none();
    if (host_) guarded(call->label, [&] { return host_->barrier(*call); });
    return py::bool_(true);
  }

  // The call last found here, as error messages name it (Python names a failure with it).
  std::string last_text() const { return last_ ? last_->label() : std::string(); }
  size_t size() const { return table_.size(); }

  // Forgets every allgather learnt: its next calls take Python's path (an allgather whose rows turned out uneven).
  void forget_allgathers() {
    for (auto it = table_.begin(); it != table_.end();)
      it = it->second->kind == Kind::allgather ? table_.erase(it) : std::next(it);
  }

 private:
  static Key key(const py::object& dtype, Kind kind, const Shape& shape, int64_t root, std::array<char, 16> op) {
    Key k;
    k.dtype = dtype.ptr(), k.kind = kind, k.ndim = static_cast<int>(shape.size()), k.root = root, k.op = op;
    std::copy_n(shape.begin(), std::min<size_t>(shape.size(), kMaxDims), k.shape.begin());  // (more: not kept)
    return k;
  }

  static Entry entry(const py::object& dtype, Kind kind, const Shape& in, const Shape& result) {
    Entry e;
    e.dtype = dtype, e.kind = kind, e.result = result;
    e.in_bytes = e.out_bytes = static_cast<size_t>(py::dtype(dtype).itemsize());
    for (auto n : in) e.in_bytes *= static_cast<size_t>(n);
    for (auto n : result) e.out_bytes *= static_cast<size_t>(n);
    return e;
  }

  void remember(const Key& k, Entry e) {
    if (e.result.size() > kMaxDims || static_cast<size_t>(k.ndim) > kMaxDims) return;  // Python's path, always
    if (table_.size() >= kMaxEntries) table_.clear();
    table_[k] = std::make_shared<Entry>(std::move(e));
  }

  // The entry for a C-contiguous array of a known signature (and the array's view), or null.
  EntryPtr find(py::handle array, Kind kind, int64_t root, std::array<char, 16> op, View* in) {
    if (!view_of(array, in) || !(in->flags & kContiguous)) return nullptr;
    Key k;
    k.dtype = in->dtype, k.kind = kind, k.ndim = in->ndim, k.root = root, k.op = op;
    std::copy(in->shape, in->shape + in->ndim, k.shape.begin());
    const auto it = table_.find(k);
    if (it == table_.end()) return nullptr;
    last_ = it->second;
    return it->second;
  }

  // A known reduction of `array` by the op named `op`, with its output in *dst (and both views), or null.
  EntryPtr reduction(py::handle array, Kind kind, py::handle op, py::handle out, View* in, View* to,
                     py::object* dst) {
    std::array<char, 16> name{};
    const auto e = op_name(op, &name) ? find(array, kind, 0, name, in) : nullptr;
    if (e) *dst = output(*e, out, to);
    return *dst ? e : nullptr;
  }

  // Where the result goes: a new array, out itself when it is a plain writable C-contiguous array of the result's
  // shape and the same dtype object (the input itself, in place, included), or nothing (Python's path).
  py::object output(const Entry& e, py::handle out, View* to) {
    if (out.is_none()) {
      py::array made(py::dtype(e.dtype), e.result);
      view_of(made, to);
      return std::move(made);
    }
    if (!view_of(out, to) || to->dtype != e.dtype.ptr() || !same_shape(*to, e.result) ||
        (to->flags & (kContiguous | kWritable)) != (kContiguous | kWritable))
      return py::object();
    return py::reinterpret_borrow<py::object>(out);
  }

  // e's planned run, if the plan moves exactly `bytes` (default: the call's input; else Python's path, always).
  bool planned(Entry* e, py::object plan, py::object options, py::object failed, size_t bytes = 0) {
    if (!executor_) return false;
    auto p = std::make_shared<PlannedRun>();
    p->plan = &plan.cast<const PyPlan&>();
    p->options = &options.cast<const PyRunOptions&>();
    if (p->options->group ||
        static_cast<size_t>(p->plan->extent) * dtype_size(p->options->dtype) != (bytes ? bytes : e->in_bytes))
      return false;
    p->plan_object = std::move(plan), p->options_object = std::move(options), p->failed = std::move(failed);
    if (!p->options->header) p->own.resize(e->in_bytes);
    e->planned = std::move(p);
    return true;
  }

  // Root's bytes to every rank: into a new array directly, else through the entry's own buffer (a checked run
  // that raises leaves out as it was).
  py::object planned_broadcast(Entry& e, const View& in, py::handle out, int root) {
    View to{};
    py::object dst = output(e, out, &to);
    if (!dst) return py::none();
    char* buf = out.is_none() ? to.data : e.planned->own.data();
    if (executor_->transport().rank() == root) std::memcpy(buf, in.data, e.in_bytes);
    run_planned(e, [&](RunOptions& opt) { executor_->run(e.planned->plan->plan, buf, opt); });
    if (buf != to.data) std::memcpy(to.data, buf, e.in_bytes);
    return dst;
  }

  // A ride writes `to` only where every rank's call agreed (else on_mismatch raises); a checked run works in a
  // new result or the entry's own buffer, as the broadcast does.
  py::object planned_allreduce(Entry& e, const View& in, const View& to, bool fresh, py::object dst) {
    PlannedRun& p = *e.planned;
    if (p.options->header) {
      bool agreed = false;
      run_planned(e, [&](RunOptions& opt) {
        agreed = executor_->run_small(p.plan->plan, in.data, to.data, e.in_bytes, p.options->factor, opt);
      });
      if (!agreed) on_mismatch_(p.options->label);  // (raises)
      return dst;
    }
    char* buf = fresh ? to.data : p.own.data();
    run_planned(e, [&](RunOptions& opt) {
      opt.source = in.data;  // (copied in block by block: in is never buf, which is new or the entry's own)
      opt.factor = p.options->factor;
      executor_->run(p.plan->plan, buf, opt);
    });
    if (buf != to.data) std::memcpy(to.data, buf, e.in_bytes);
    return dst;
  }

  // A ride with its layout: the pieces in, the round on the buffer (written only where every rank agreed), the
  // answer out; where the round did not agree, Python's answer (or on_mismatch raises).
  py::object ride(Entry& e, const View& in, const View& to, py::object dst, py::handle array, py::handle out) {
    PlannedRun& p = *e.planned;
    for (const auto& [at, from, n] : p.pieces) std::memcpy(p.buffer + at, in.data + from, n);
    bool agreed = false;
    run_planned(e, [&](RunOptions& opt) {  // (opt.bytes: the whole round's)
      if (!p.options->header) {  // checked on receipt: it raises where calls differ
        executor_->run(p.plan->plan, p.buffer, opt);
        agreed = true;
        return;
      }
      agreed = executor_->run_small(p.plan->plan, p.buffer, p.buffer, static_cast<size_t>(opt.bytes),
                                    p.options->factor, opt);
    });
    if (!agreed) {
      if (p.disagreed.is_none()) {
        on_mismatch_(p.options->label);  // (raises)
        return py::none();
      }
      return p.disagreed(array, out);
    }
    if (p.answer_pieces.empty())
      std::memcpy(to.data, p.buffer + p.answer_at, e.out_bytes);
    else
      for (const auto& [at, into, n] : p.answer_pieces) std::memcpy(to.data + into, p.buffer + at, n);
    return dst;
  }

  // Runs e's plan without the GIL, its caller waiting (the executor polls); a mismatch raises as the executor's
  // do (MismatchError), a transport failure as Python's failed() names it.
  template <typename Run>
  void run_planned(Entry& e, Run body) {
    PlannedRun& p = *e.planned;
    RunOptions opt = native_options(*p.options);
    opt.bytes = p.plan->extent * static_cast<int64_t>(dtype_size(p.options->dtype));  // (a ride: the whole round)
    try {
      py::gil_scoped_release nogil;
      executor_->caller_waits(true);
      struct Waited {
        Executor* ex;
        ~Waited() { ex->caller_waits(false); }
      } waited{executor_};
      body(opt);
    } catch (const TransportError& error) {
      raise_named(error, [&](py::object raised) { return p.failed(raised); });
    }
  }

  // A transport failure as the Python error name(raised) returns (RankFailure keeps its ranks).
  template <typename Name>
  [[noreturn]] static void raise_named(const TransportError& error, Name name) {
    const auto errors = py::module_::import("ddl.errors");
    const auto* failure = dynamic_cast<const RankFailure*>(&error);
    py::object raised = failure ? errors.attr("RankFailure")(failure->what(), failure->ranks)
                                : errors.attr("TransportError")(error.what());
    py::object named = name(raised);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(named.ptr())), named.ptr());
    throw py::error_already_set();
  }

  // A job of one rank: every collective's result is the input (an average over one rank included).
  static py::object alone(const Entry& e, const View& in, const View& to, py::object dst) {
    if (to.data != in.data) std::memmove(to.data, in.data, e.in_bytes);
    return dst;
  }

  template <typename Collective>
  py::object run(Entry& e, py::handle result, Collective collective) {
    return guarded(e.host_call().label, collective) ? py::reinterpret_borrow<py::object>(result) : py::none();
  }

  // Runs a collective without the GIL; a mismatch goes to on_mismatch, a transport failure through on_failure.
  template <typename Collective>
  bool guarded(const std::string& label, Collective collective) {
    bool agreed;
    try {
      py::gil_scoped_release nogil;
      agreed = collective();
    } catch (const TransportError& error) {  // (RankFailure among them)
      raise_named(error, [&](py::object raised) { return on_failure_(raised, label); });
    }
    if (!agreed) on_mismatch_(label);  // (raises)
    return agreed;
  }

  py::object owner_;  // the HostMemory's Python object: the segment stays mapped while this table lives
  HostMemory* host_;  // null: one rank, or ranks across hosts (executor_)
  py::object executor_owner_;
  Executor* executor_;  // null: the host level, or one rank
  py::object on_mismatch_, on_failure_;
  std::unordered_map<Key, EntryPtr, KeyHash> table_;
  EntryPtr last_;
  std::shared_ptr<HostCall> barrier_;
};

}  // namespace

void bind_short_calls(py::module_& m) {
  py::class_<ShortCalls>(m, "ShortCalls",
                         "A communicator's known host level calls, each found and run in one native call: a result, "
                         "None (not known here: Python's path) or, for an allgather of uneven rows, (every rank's "
                         "length in bytes, the call's text, its hash). Ranks that called differently: "
                         "on_mismatch(text), which raises; a transport failure: on_failure(error, text) is raised.")
      .def(py::init<py::object, py::object, py::object, py::object>(), py::arg("host"), py::arg("on_mismatch"),
           py::arg("on_failure"), py::arg("executor") = py::none(),
           "host: the communicator's HostMemory, or None in a job of one rank (every collective a copy) or across "
           "hosts (executor: the communicator's Executor, which runs the calls learnt by learn_planned_*).")
      .def("learn_planned_broadcast", &ShortCalls::learn_planned_broadcast, py::arg("dtype"), py::arg("shape"),
           py::arg("root"), py::arg("plan"), py::arg("options"), py::arg("failed"),
           "A checked broadcast: later calls run `plan` with `options`; failed(error) names a transport failure.")
      .def("learn_planned_allreduce", &ShortCalls::learn_planned_allreduce, py::arg("dtype"), py::arg("shape"),
           py::arg("op"), py::arg("plan"), py::arg("options"), py::arg("failed"),
           "An allreduce checked on receipt (options without a header) or riding in the agreement round (with one).")
      .def("learn_ride", &ShortCalls::learn_ride, py::arg("dtype"), py::arg("shape"), py::arg("op"),
           py::arg("result"), py::arg("plan"), py::arg("options"), py::arg("buffer"), py::arg("pieces"),
           py::arg("answer_at"), py::arg("failed"), py::arg("disagreed"),
           py::arg("answer_pieces") = std::vector<std::array<size_t, 3>>{},
           "An allgather (op None) or reduce-scatter riding in the agreement round, or an allgather checked on "
           "receipt (options without a header): the input's pieces (buffer byte, input byte, bytes) go into "
           "`buffer`, the round or plan runs on it, the answer is `result`'s bytes from answer_at, or answer_pieces "
           "(buffer byte, output byte, bytes) where given. disagreed(array, out): Python's answer where the round "
           "did not agree (None: on_mismatch).")
      .def("learn_broadcast", &ShortCalls::learn_broadcast, py::arg("dtype"), py::arg("shape"), py::arg("root"),
           py::arg("call"))
      .def("learn_allgather", &ShortCalls::learn_allgather, py::arg("dtype"), py::arg("shape"), py::arg("gathered"),
           py::arg("call"))
      .def("learn_allreduce", &ShortCalls::learn_allreduce, py::arg("dtype"), py::arg("shape"), py::arg("op"),
           py::arg("call"))
      .def("learn_reduce_scatter", &ShortCalls::learn_reduce_scatter, py::arg("dtype"), py::arg("shape"),
           py::arg("op"), py::arg("part"), py::arg("call"))
      .def("broadcast", &ShortCalls::broadcast, py::arg("array"), py::arg("root"), py::arg("out"))
      .def("allgather", &ShortCalls::allgather, py::arg("array"), py::arg("out"))
      .def("allreduce", &ShortCalls::allreduce, py::arg("array"), py::arg("op"), py::arg("out"))
      .def("reduce_scatter", &ShortCalls::reduce_scatter, py::arg("array"), py::arg("op"), py::arg("out"))
      .def("learn_barrier", &ShortCalls::learn_barrier, py::arg("call"))
      .def("barrier", &ShortCalls::barrier)
      .def("forget_allgathers", &ShortCalls::forget_allgathers,
           "Forgets every allgather learnt: its next calls take Python's path.")
      .def_property_readonly("last_text", &ShortCalls::last_text)
      .def("__len__", &ShortCalls::size);
}
