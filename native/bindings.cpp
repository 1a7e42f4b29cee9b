// Python bindings of the executor: ddl._native. Python builds plans; this runs them with the GIL released.
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "ddl/cuda_driver.hpp"
#include "ddl/executor.hpp"
#include "ddl/host_calls.hpp"
#include "ddl/host_memory.hpp"
#include "ddl/loopback.hpp"
#include "ddl/mpi_transport.hpp"
#include "ddl/parts.hpp"
#include "ddl/python_run.hpp"
#include "ddl/staging.hpp"
#include "ddl/tcp_transport.hpp"

namespace py = pybind11;
using namespace ddl;

void bind_device(py::module_& m);       // device_bindings.cpp: CUDA driver, buffers, NCCL
void bind_short_calls(py::module_& m);  // short_calls.cpp: the host level's calls found and run in one

namespace {

using Rows = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

Program program_from_rows(const Rows& rows, int64_t scratch_elems, int32_t tags) {
  if (rows.ndim() != 2 || (rows.shape(0) && rows.shape(1) != kStepFields))
    throw std::invalid_argument("program rows must have shape (n, " + std::to_string(kStepFields) + ")");
  return make_program(rows.data(), static_cast<size_t>(rows.shape(0)), scratch_elems, tags);
}

// Elements a plan touches: the buffer must be at least this long.
int64_t plan_extent(const Plan& plan) {
  int64_t extent = 0;
  for (const Block& b : plan.blocks) {
    if (b.program < 0 || static_cast<size_t>(b.program) >= plan.programs.size())
      throw std::invalid_argument("block names program " + std::to_string(b.program) + " that does not exist");
    for (const Step& s : plan.programs[static_cast<size_t>(b.program)].steps)
      extent = std::max(extent, b.offset + s.offset + s.count);
  }
  return extent;
}

PyPlan make_plan(const std::vector<Program>& programs, const Rows& blocks, int32_t inflight) {
  if (blocks.ndim() != 2 || (blocks.shape(0) && blocks.shape(1) != 2))
    throw std::invalid_argument("blocks must have shape (n, 2): offset, program");
  PyPlan p;
  p.plan.programs = programs;
  p.plan.inflight = std::max(1, inflight);
  for (py::ssize_t i = 0; i < blocks.shape(0); ++i)
    p.plan.blocks.push_back(Block{blocks.at(i, 0), static_cast<int32_t>(blocks.at(i, 1))});
  p.extent = plan_extent(p.plan);
  return p;
}

// Checked as bytes, so a caller may hand over any view of its data (bfloat16 arrays cannot export a buffer
// format, so they arrive as uint16 views).
void* contiguous_buffer(const py::buffer& buf, DType dtype, int64_t extent, bool writable) {
  py::buffer_info info = buf.request(writable);
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim; d-- > 0;) {  // C-contiguous only
    if (info.shape[d] > 1 && info.strides[d] != expect) throw std::invalid_argument("buffer is not C-contiguous");
    expect *= info.shape[d];
  }
  const int64_t have = static_cast<int64_t>(info.size * info.itemsize);
  if (have < extent * static_cast<int64_t>(dtype_size(dtype)))
    throw std::invalid_argument("buffer holds " + std::to_string(have) + " bytes, plan needs " +
                                std::to_string(extent) + " elements of " + dtype_name(dtype));
  return info.ptr;
}

void* writable_buffer(const py::buffer& buf, DType dtype, int64_t extent) {
  return contiguous_buffer(buf, dtype, extent, true);
}

int64_t elements(const py::buffer& buf, DType dtype) {
  py::buffer_info info = buf.request();
  return static_cast<int64_t>(info.size * info.itemsize / static_cast<py::ssize_t>(dtype_size(dtype)));
}

// The one entry: returns whether every rank's header equalled this one's (true when there is none).
bool run(Executor& ex, const PyPlan& plan, const py::buffer& buf, const PyRunOptions& o, const py::object& out,
         const py::object& source) {
  RunOptions opt = native_options(o);
  opt.bytes = plan.extent * static_cast<int64_t>(dtype_size(o.dtype));
  if (!source.is_none()) {  // out of place (RunOptions::source): the same bytes as the buffer, elsewhere
    if (o.group != nullptr || o.header || !out.is_none())
      throw std::invalid_argument("a run from a source is a plain one: no staging, no header, no out");
    const auto src = py::reinterpret_borrow<py::buffer>(source);
    const int64_t n = elements(buf, o.dtype), given = elements(src, o.dtype);
    if (given != n || n != plan.extent)
      throw std::invalid_argument("source, buffer and plan must hold the same elements (source " +
                                  std::to_string(given) + ", buffer " + std::to_string(n) + ", plan " +
                                  std::to_string(plan.extent) + ")");
    opt.source = contiguous_buffer(src, o.dtype, n, false);
    const char* from = static_cast<const char*>(opt.source);
    const char* to = static_cast<const char*>(contiguous_buffer(buf, o.dtype, n, false));
    if (from < to + opt.bytes && to < from + opt.bytes) throw std::invalid_argument("source overlaps the buffer");
  }
  if (o.group != nullptr) {
    if (o.header || !out.is_none()) throw std::invalid_argument("a staged run takes no header and no out");
    char* staging = static_cast<char*>(writable_buffer(buf, o.dtype, plan.extent));
    py::gil_scoped_release nogil;
    run_staged(ex, *o.group, plan.plan, o.device, staging, opt, o.factor);
    return true;
  }
  if (!out.is_none()) {
    if (!o.header) throw std::invalid_argument("a run into out needs a header (it is the small collective)");
    const int64_t n = elements(buf, o.dtype);
    if (n != plan.extent && !(n == 0 && plan.extent == 0))
      throw std::invalid_argument("source holds " + std::to_string(n) + " elements, plan moves " +
                                  std::to_string(plan.extent));
    void* dst = writable_buffer(out, o.dtype, n);
    const void* in = contiguous_buffer(buf, o.dtype, n, false);
    py::gil_scoped_release nogil;
    return ex.run_small(plan.plan, in, dst, static_cast<size_t>(n) * dtype_size(o.dtype), o.factor, opt);
  }
  void* ptr = writable_buffer(buf, o.dtype, plan.extent);
  {
    py::gil_scoped_release nogil;  // the buffer stays alive: the caller holds it
    opt.factor = o.factor;
    ex.run(plan.plan, ptr, opt);
  }
  return !o.header || (opt.header[0] == *o.header && opt.header[1] == -*o.header);
}

// A planned reduce-scatter or allgather through its staged buffer: the pieces go in and out block by block,
// around the blocks' runs (ddl/parts.hpp). src and dst are bytes; their sizes are checked against the parts.
void run_parts(Executor& ex, const PyPlan& plan, const py::buffer& staged, const py::buffer& src,
               const py::buffer& dst, bool gather, const std::vector<int64_t>& counts,
               const std::vector<int64_t>& positions, int64_t piece, const PyRunOptions& o) {
  const int rank = ex.transport().rank();
  if (counts.size() != positions.size() || static_cast<int>(counts.size()) != ex.transport().size())
    throw std::invalid_argument("counts and positions need one entry per rank");
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  const int64_t mine = counts[static_cast<size_t>(rank)];
  RunOptions opt = native_options(o);
  opt.bytes = plan.extent * static_cast<int64_t>(dtype_size(o.dtype));
  char* stage = static_cast<char*>(writable_buffer(staged, o.dtype, plan.extent));
  const char* in = static_cast<const char*>(contiguous_buffer(src, o.dtype, gather ? mine : total, false));
  char* out = static_cast<char*>(writable_buffer(dst, o.dtype, gather ? total : mine));
  PartsCopies copies(gather, stage, in, out, dtype_size(o.dtype), piece, counts, positions, rank);
  opt.hooks = &copies;
  py::gil_scoped_release nogil;
  ex.run(plan.plan, stage, opt);
  if (o.factor != 1.0 && !gather) scale(out, mine, o.dtype, o.factor);
}

// The host memory level's calls: buffers are taken as bytes here (one buffer request each: the small path is
// counted in hundreds of nanoseconds), the collective runs with the GIL released.
struct Bytes {
  char* ptr;
  size_t size;
};

Bytes bytes_of(const py::buffer& buf, bool writable) {
  Py_buffer view;  // numpy refuses a non-contiguous or read-only array here, with its own message
  if (PyObject_GetBuffer(buf.ptr(), &view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0)
    throw py::error_already_set();
  const Bytes b{static_cast<char*>(view.buf), static_cast<size_t>(view.len)};
  PyBuffer_Release(&view);  // the caller holds the object: its memory stays
  return b;
}

void need(const Bytes& b, size_t bytes, const char* what) {
  if (b.size < bytes)
    throw std::invalid_argument(std::string(what) + " holds " + std::to_string(b.size) + " bytes; the call needs " +
                                std::to_string(bytes));
}

HostCall host_call(int64_t hash, double timeout, std::string label, bool run_ahead = false) {
  HostCall c;
  c.hash = hash, c.timeout_s = timeout, c.label = std::move(label), c.run_ahead = run_ahead;
  return c;
}

bool allreduce(HostMemory& h, const py::buffer& src, const py::buffer& dst, DType t, ReduceOp op, double factor,
               size_t one_phase, HostCall& c) {
  const Bytes in = bytes_of(src, false), out = bytes_of(dst, true);
  need(out, in.size, "dst");
  py::gil_scoped_release nogil;
  return h.allreduce(in.ptr, out.ptr, static_cast<int64_t>(in.size / dtype_size(t)), t, op, factor, one_phase, c);
}

bool broadcast(HostMemory& h, const py::buffer& buf, int root, HostCall& c) {
  const Bytes data = bytes_of(buf, true);
  py::gil_scoped_release nogil;
  return h.broadcast(data.ptr, data.size, root, c);
}

// The equal-rows allgather: True (gathered into dst), False (ranks called differently), or every rank's length
// in bytes (the rows were uneven: dst is untouched, the caller gathers with that layout).
py::object allgather_equal(HostMemory& h, const py::buffer& src, const py::buffer& dst, HostCall& c) {
  const Bytes in = bytes_of(src, false), out = bytes_of(dst, true);
  need(out, in.size * static_cast<size_t>(h.size()), "dst");
  std::vector<int64_t> lengths;
  bool equal = false, agreed;
  {
    py::gil_scoped_release nogil;
    agreed = h.allgather_equal(in.ptr, out.ptr, in.size, lengths, &equal, c);
  }
  if (!agreed || equal) return py::bool_(agreed);
  return py::cast(lengths);
}

bool reduce_scatter(HostMemory& h, const py::buffer& src, const py::buffer& dst, const std::vector<int64_t>& starts,
                    const std::vector<int64_t>& counts, DType t, ReduceOp op, double factor, HostCall& c) {
  const Bytes in = bytes_of(src, false), out = bytes_of(dst, true);
  int64_t end = 0;
  for (size_t r = 0; r < starts.size() && r < counts.size(); ++r) end = std::max(end, starts[r] + counts[r]);
  const size_t me = static_cast<size_t>(h.rank());
  need(in, static_cast<size_t>(end) * dtype_size(t), "src");
  need(out, static_cast<size_t>(me < counts.size() ? counts[me] : 0) * dtype_size(t), "dst");
  py::gil_scoped_release nogil;
  return h.reduce_scatter(in.ptr, out.ptr, starts, counts, t, op, factor, c);
}

bool barrier(HostMemory& h, HostCall& c) {
  py::gil_scoped_release nogil;
  return h.barrier(c);
}

void bind_host(py::module_& m) {
  using V = std::vector<int64_t>;
  py::class_<HostCall>(m, "HostCall", "A host level call's hash, deadline and label, made once per signature.")
      .def(py::init(&host_call), py::arg("hash"), py::arg("timeout"), py::arg("label"), py::arg("run_ahead") = false,
           "run_ahead: a broadcast of up to HostMemory.RUN_AHEAD_BYTES returns on the root at once and is checked "
           "on receipt (every rank has made the call before)");
  py::class_<HostAllreduce>(m, "HostAllreduce", "An allreduce's dtype, op, factor and phases, and its HostCall.")
      .def(py::init([](DType t, ReduceOp op, double factor, size_t one_phase, int64_t hash, double timeout,
                       std::string label) {
             return HostAllreduce{t, op, factor, one_phase, host_call(hash, timeout, std::move(label))};
           }), py::arg("dtype"), py::arg("op"), py::arg("factor"), py::arg("one_phase"), py::arg("hash"),
           py::arg("timeout"), py::arg("label"));
  py::class_<HostReduceScatter>(m, "HostReduceScatter",
                                "A reduce_scatter's parts, dtype, op and factor, and its HostCall.")
      .def(py::init([](V starts, V counts, DType t, ReduceOp op, double factor, int64_t hash, double timeout,
                       std::string label) {
             return HostReduceScatter{std::move(starts), std::move(counts), t, op, factor,
                                      host_call(hash, timeout, std::move(label))};
           }), py::arg("starts"), py::arg("counts"), py::arg("dtype"), py::arg("op"), py::arg("factor"),
           py::arg("hash"), py::arg("timeout"), py::arg("label"));
  // Each collective comes in two forms: with its prepared call (the short paths) and with the call's parts.
  py::class_<HostMemory>(m, "HostMemory",
                         "The host level: the ranks of one host collect through one shared-memory segment.")
      .def(py::init<const std::string&, bool, int, int, size_t, std::vector<int>, std::vector<int>>(),
           py::arg("name"), py::arg("create"), py::arg("rank"), py::arg("size"), py::arg("slot_bytes"),
           py::arg("pids"), py::arg("ranks"))
      .def_static("unlink", &HostMemory::unlink, py::arg("name"))
      .def_property_readonly("broken", &HostMemory::broken)
      .def_property_readonly("slot_bytes", &HostMemory::slot_bytes)
      .def_readonly_static("RUN_AHEAD_BYTES", &HostMemory::kRunAheadBytes)
      .def_readonly_static("RUN_AHEAD_DEPTH", &HostMemory::kRunAheadDepth)
      .def_property_readonly("history", &HostMemory::history,
                             "The run-ahead broadcasts the last full step checked, as errors name them.")
      .def_property_readonly("probe_address", &HostMemory::probe_address,
                             "Where this rank's probe word is, for a peer's can_read.")
      .def("can_read", &HostMemory::can_read, py::arg("rank"), py::arg("address"),
           "Whether this process can read member `rank`'s memory at `address` (its probe_address).")
      .def_property("single_copy_bytes", &HostMemory::single_copy_bytes, &HostMemory::single_copy_from,
                    "Broadcasts and allgathers from this many bytes read the writer's buffer directly (0: never). "
                    "Set it alike on every rank.")
      .def("allreduce", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, HostAllreduce& a) {
        return allreduce(h, src, dst, a.dtype, a.op, a.factor, a.one_phase, a.call);
      }, py::arg("src"), py::arg("dst"), py::arg("call"))
      .def("allreduce", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, DType t, ReduceOp op,
                           double factor, size_t one_phase, int64_t hash, double timeout, std::string label) {
        HostCall c = host_call(hash, timeout, std::move(label));
        return allreduce(h, src, dst, t, op, factor, one_phase, c);
      }, py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("op"), py::arg("factor"), py::arg("one_phase"),
         py::arg("hash"), py::arg("timeout"), py::arg("label"))
      .def("broadcast", &broadcast, py::arg("buffer"), py::arg("root"), py::arg("call"))
      .def("broadcast", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, int root, HostCall& c) {
        // out of place: root sends from src (only read) and copies it to dst; the others receive into dst
        const Bytes in = bytes_of(src, false), out = bytes_of(dst, true);
        need(out, in.size, "dst");
        py::gil_scoped_release nogil;
        const bool root_here = h.rank() == root;
        const bool agreed = h.broadcast(root_here ? in.ptr : out.ptr, in.size, root, c);
        if (agreed && root_here && out.ptr != in.ptr) std::memmove(out.ptr, in.ptr, in.size);
        return agreed;
      }, py::arg("src"), py::arg("dst"), py::arg("root"), py::arg("call"))
      .def("broadcast", [](HostMemory& h, const py::buffer& buf, int root, int64_t hash, double timeout,
                           std::string label) {
        HostCall c = host_call(hash, timeout, std::move(label));
        return broadcast(h, buf, root, c);
      }, py::arg("buffer"), py::arg("root"), py::arg("hash"), py::arg("timeout"), py::arg("label"))
      .def("allgather", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, const V& offsets,
                           const V& lengths, int64_t hash, double timeout, std::string label) {
        const Bytes in = bytes_of(src, false), out = bytes_of(dst, true);
        int64_t end = 0;
        for (size_t r = 0; r < offsets.size() && r < lengths.size(); ++r) end = std::max(end, offsets[r] + lengths[r]);
        need(out, static_cast<size_t>(end), "dst");
        const size_t me = static_cast<size_t>(h.rank());
        need(in, me < lengths.size() ? static_cast<size_t>(lengths[me]) : 0, "src");
        HostCall c = host_call(hash, timeout, std::move(label));
        py::gil_scoped_release nogil;
        return h.allgather(in.ptr, out.ptr, offsets, lengths, c);
      }, py::arg("src"), py::arg("dst"), py::arg("offsets"), py::arg("lengths"), py::arg("hash"),
         py::arg("timeout"), py::arg("label"))
      .def("allgather_equal", &allgather_equal, py::arg("src"), py::arg("dst"), py::arg("call"),
           "True (gathered into dst), False (ranks called differently), or every rank's length in bytes (uneven "
           "rows: dst untouched).")
      .def("allgather_equal", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, int64_t hash,
                                 double timeout, std::string label) {
        HostCall c = host_call(hash, timeout, std::move(label));
        return allgather_equal(h, src, dst, c);
      }, py::arg("src"), py::arg("dst"), py::arg("hash"), py::arg("timeout"), py::arg("label"))
      .def("reduce_scatter", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, HostReduceScatter& p) {
        return reduce_scatter(h, src, dst, p.starts, p.counts, p.dtype, p.op, p.factor, p.call);
      }, py::arg("src"), py::arg("dst"), py::arg("call"))
      .def("reduce_scatter", [](HostMemory& h, const py::buffer& src, const py::buffer& dst, const V& starts,
                                const V& counts, DType t, ReduceOp op, double factor, int64_t hash, double timeout,
                                std::string label) {
        HostCall c = host_call(hash, timeout, std::move(label));
        return reduce_scatter(h, src, dst, starts, counts, t, op, factor, c);
      }, py::arg("src"), py::arg("dst"), py::arg("starts"), py::arg("counts"), py::arg("dtype"), py::arg("op"),
         py::arg("factor"), py::arg("hash"), py::arg("timeout"), py::arg("label"))
      .def("barrier", &barrier, py::arg("call"))
      .def("barrier", [](HostMemory& h, int64_t hash, double timeout, std::string label) {
        HostCall c = host_call(hash, timeout, std::move(label));
        return barrier(h, c);
      }, py::arg("hash"), py::arg("timeout"), py::arg("label"));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  // mpi4py's C API is imported on first use, not here: importing it initialises MPI, which a process that
  // runs alone (and `import ddl`) should not pay for.
  m.doc() = "ddl's native executor: runs compiled schedules over MPI or an in-process loopback.";

  // ddl's native errors become ddl.errors' classes, in one place.
  py::register_exception_translator([](std::exception_ptr p) {
    const char* name = nullptr;
    std::string what;
    try {
      if (p) std::rethrow_exception(p);
    } catch (const RankFailure& e) {  // ddl.errors.RankFailure(message, ranks)
      py::object error = py::module_::import("ddl.errors").attr("RankFailure")(e.what(), e.ranks);
      PyErr_SetObject(error.get_type().ptr(), error.ptr());
      return;
    } catch (const TransportError& e) {
      name = "TransportError", what = e.what();
    } catch (const DeviceError& e) {
      name = "DeviceError", what = e.what();
    } catch (const CallMismatch& e) {
      name = "MismatchError", what = e.what();
    }
    if (name) PyErr_SetString(py::module_::import("ddl.errors").attr(name).ptr(), what.c_str());
  });

  py::enum_<DType>(m, "DType")
      .value("float16", DType::float16).value("bfloat16", DType::bfloat16)
      .value("float32", DType::float32).value("float64", DType::float64)
      .value("int32", DType::int32).value("int64", DType::int64).value("uint8", DType::uint8);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum).value("prod", ReduceOp::prod)
      .value("min", ReduceOp::min).value("max", ReduceOp::max);
  bind_device(m);
  bind_host(m);
  bind_short_calls(m);

  m.def("clock_ns", &clock_ns, "The executor's clock (steady, nanoseconds): the time base of take_spans().");
  m.def("reduce_into", [](const py::buffer& dst, const py::buffer& src, DType dtype, ReduceOp op) {
    const int64_t n = elements(src, dtype);
    void* d = writable_buffer(dst, dtype, n);
    py::buffer_info s = src.request();
    py::gil_scoped_release nogil;
    reduce_into(d, s.ptr, n, dtype, op);
  }, py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("op"), "dst = dst (op) src, elementwise.");
  m.def("scale", [](const py::buffer& buf, DType dtype, double factor) {
    const int64_t n = elements(buf, dtype);
    void* d = writable_buffer(buf, dtype, n);
    py::gil_scoped_release nogil;
    scale(d, n, dtype, factor);
  }, py::arg("buf"), py::arg("dtype"), py::arg("factor"), "buf *= factor (floating types).");

  // The step layout, declared once: Python builds rows with these field positions and kind codes.
  py::enum_<StepKind>(m, "StepKind")
      .value("send", StepKind::send).value("recv_reduce", StepKind::recv_reduce)
      .value("recv_copy", StepKind::recv_copy);
  py::tuple fields(kStepFields);
  for (size_t i = 0; i < kStepFields; ++i) fields[i] = py::str(kStepFieldNames[i]);
  m.attr("STEP_FIELDS") = fields;

  py::class_<PyRunOptions>(m, "RunOptions")
      .def(py::init([](DType dtype, ReduceOp op, double timeout, std::string label, std::optional<int64_t> header,
                       int64_t capacity, double factor, nccl::Group* group, uintptr_t device, int64_t check) {
             PyRunOptions o;
             o.dtype = dtype, o.op = op, o.timeout = timeout, o.label = std::move(label), o.header = header;
             o.capacity = capacity, o.factor = factor, o.group = group, o.device = device, o.check = check;
             return o;
           }),
           py::arg("dtype"), py::arg("op") = ReduceOp::sum, py::arg("timeout") = 300.0,
           py::arg("label") = "collective", py::arg("header") = py::none(), py::arg("capacity") = 0,
           py::arg("factor") = 1.0, py::arg("group") = nullptr, py::arg("device") = 0, py::arg("check") = 0,
           py::keep_alive<1, 9>(),  // the options keep the NCCL group they stage through alive
           "How a run goes: element type and op, deadline and label; header: the agreement hash every message "
           "carries (merged by max, with -hash); capacity: payload bytes a header-mode receive accepts; factor: "
           "the result is scaled by it; group and device: stage the GPU block at `device` through the buffer; "
           "check: the call's hash, compared on receipt where the transport can (ddl's TCP), instead of an "
           "agreement round before the run.")
      .def_readonly("dtype", &PyRunOptions::dtype)
      .def_readonly("op", &PyRunOptions::op)
      .def_readonly("timeout", &PyRunOptions::timeout)
      .def_readonly("label", &PyRunOptions::label)
      .def_readonly("header", &PyRunOptions::header)
      .def_readonly("capacity", &PyRunOptions::capacity)
      .def_readonly("factor", &PyRunOptions::factor)
      .def_readonly("check", &PyRunOptions::check);

  py::class_<Program>(m, "Program")
      .def(py::init(&program_from_rows), py::arg("rows"), py::arg("scratch_elems"), py::arg("tags"),
           "rows: int64 (n, len(STEP_FIELDS)), one step per row in STEP_FIELDS order; sorted by round.")
      .def_property_readonly("nsteps", [](const Program& p) { return p.steps.size(); })
      .def_property_readonly("nrounds", [](const Program& p) { return p.round_begin.size() - 1; });

  py::class_<PyPlan>(m, "Pipeline")
      .def(py::init(&make_plan), py::arg("programs"), py::arg("blocks"), py::arg("inflight"))
      .def_property_readonly("extent", [](const PyPlan& p) { return p.extent; })
      .def_property_readonly("nblocks", [](const PyPlan& p) { return p.plan.blocks.size(); });

  py::class_<LoopbackHub, std::shared_ptr<LoopbackHub>>(m, "LoopbackHub")
      .def(py::init<int>(), py::arg("size"))
      .def_property_readonly("size", &LoopbackHub::size);

  py::class_<TcpTransport, std::shared_ptr<TcpTransport>>(m, "TcpTransport",
      "ddl's own TCP connections between ranks (ddl.core.tcp sets them up); listening from construction.")
      .def(py::init<int, int, const std::string&, bool>(), py::arg("rank"), py::arg("size"),
           py::arg("bind_address") = "", py::arg("yield_when_idle") = false)
      .def_property_readonly("port", &TcpTransport::port)
      .def_property_readonly("unix_peers", &TcpTransport::unix_peers,
                             "Peers connected over a Unix socket (ranks of this host), once connected.")
      .def_property_readonly("spins", &TcpTransport::spins,
                             "Waits of runs a caller waited for that polled on instead of blocking in epoll.")
      .def_property_readonly("spin_window_us", &TcpTransport::spin_window_us,
                             "How long a waiting caller polls before it blocks (microseconds; it adapts).")
      .def_static(
          "next_spin_window_us",
          [](int64_t window_us, int64_t spun_us, int64_t blocked_us) {
            using us = std::chrono::microseconds;
            return std::chrono::duration_cast<us>(
                       TcpTransport::next_spin_window(us(window_us), us(spun_us), us(blocked_us)))
                .count();
          },
          py::arg("window_us"), py::arg("spun_us"), py::arg("blocked_us"),
          "The spin window after a wait that spun spun_us, then blocked blocked_us (the rule spin_window_us follows).")
      .def_property_readonly("shared_peers", &TcpTransport::shared_peers,
                             "Of those, peers read and written through shared memory (a SharedPipe each).")
      .def("connect", &TcpTransport::connect, py::arg("addresses"), py::arg("ports"), py::arg("nonce"),
           py::arg("timeout_s"), py::arg("pipe_bytes") = 0, py::call_guard<py::gil_scoped_release>(),
           "Connects to every peer (addresses[p]: rank p's candidates, in order; ports[p] its port); lower ranks "
           "are dialed, higher ones accepted; both sides check the job's nonce. pipe_bytes > 0: a peer of this "
           "host reached over its Unix socket talks through shared memory, that many bytes each way.")
      .def_static("local_addresses", &TcpTransport::local_addresses,
                  "This machine's IPv4 addresses but loopback: (interface, address).")
      .def_property_readonly_static("RUN_AHEAD", [](py::object) { return TcpTransport::kRunAhead; },
                                    "How many calls checked on receipt a rank may finish ahead of the rank "
                                    "before it (where calls differ: how many it may finish before it raises).");

  py::class_<Executor>(m, "Executor")
      .def_static("tcp", [](std::shared_ptr<TcpTransport> t) { return std::make_unique<Executor>(std::move(t)); },
                  py::arg("transport"), "Executor over connected TcpTransport.")
      .def_static("mpi", [](py::handle comm, bool yield_when_idle) {
        if (import_mpi4py() < 0) throw py::error_already_set();
        MPI_Comm* c = PyMPIComm_Get(comm.ptr());
        if (c == nullptr) throw py::error_already_set();
        return std::make_unique<Executor>(std::make_shared<MpiTransport>(*c, yield_when_idle));
      }, py::arg("comm"), py::arg("yield_when_idle") = false,
      "Executor over an mpi4py communicator (keep the communicator alive); yield_when_idle: give the core away "
      "between polls where MPI itself does not.")
      .def_static("loopback", [](std::shared_ptr<LoopbackHub> hub, int rank) {
        if (rank < 0 || rank >= hub->size()) throw std::invalid_argument("rank outside the hub");
        return std::make_unique<Executor>(std::make_shared<LoopbackTransport>(hub, rank));
      }, py::arg("hub"), py::arg("rank"))
      .def_property_readonly("rank", [](Executor& e) { return e.transport().rank(); })
      .def_property_readonly("size", [](Executor& e) { return e.transport().size(); })
      .def_property_readonly("transport", [](Executor& e) { return e.transport().name(); })
      .def_property_readonly("broken", &Executor::broken)
      .def_property_readonly("recording", &Executor::recording)
      .def("record", &Executor::record, py::arg("on"),
           "Start or stop keeping every run's round spans (block, round, start ns, end ns) for take_spans().")
      .def("rest", [](Executor& e, double longest_s, int64_t from_bytes) {
        if (longest_s < 0 || from_bytes < 0) throw std::invalid_argument("rest: negative time or size");
        e.rest(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(longest_s)), from_bytes);
      }, py::arg("longest_s"), py::arg("from_bytes"),
      "Runs of at least from_bytes sleep between polls while they wait and no caller waits for them (an eighth "
      "of the wait so far, at most longest_s; 0: never), giving the core to the caller's work; smaller runs, "
      "and runs a caller waits for (caller_waits), keep polling.")
      .def_property_readonly("rests", &Executor::rests, "How many rests runs have taken so far.")
      .def("caller_waits", &Executor::caller_waits, py::arg("on"),
           "A caller starts (True) or stops (False) waiting for this executor's runs: while any waits, runs poll.")
      .def("take_spans", [](Executor& e) {
        int64_t dropped = 0;
        std::vector<RoundSpan> spans = e.take_spans(&dropped);
        py::array_t<int64_t> out({static_cast<py::ssize_t>(spans.size()), py::ssize_t{4}});
        auto v = out.mutable_unchecked<2>();
        for (size_t i = 0; i < spans.size(); ++i) {
          const auto k = static_cast<py::ssize_t>(i);
          v(k, 0) = spans[i].block, v(k, 1) = spans[i].round, v(k, 2) = spans[i].start_ns, v(k, 3) = spans[i].end_ns;
        }
        return py::make_tuple(out, dropped);
      }, "(spans as an (n, 4) int64 array: block, round, start ns, end ns; spans dropped past the bound), "
         "and clears them.")
      .def("keep_runs", &Executor::keep_runs, py::arg("runs"),
           "Keep the last `runs` runs for the flight recorder (0: none).")
      .def("runs", [](const Executor& e) {
        py::list out;
        for (const RunRecord& r : e.runs())
          out.append(py::make_tuple(r.seq, r.label, r.bytes, r.start_ns, r.end_ns, r.state));
        return out;
      }, "The kept runs, oldest first: (seq, label, bytes, start ns, end ns, state: 0 running, 1 done, 2 failed).")
      .def("run_parts", &run_parts, py::arg("plan"), py::arg("staged"), py::arg("src"), py::arg("dst"),
           py::arg("gather"), py::arg("counts"), py::arg("positions"), py::arg("piece"), py::arg("options"),
           "A planned allgather (gather; src: this rank's part, dst: every part in rank order) or reduce-scatter "
           "(src: every part, dst: this rank's) through `staged`, each block's pieces copied in just before it "
           "starts and out as soon as it ends (GIL released).")
      .def("run", &run, py::arg("plan"), py::arg("buffer"), py::arg("options"), py::arg("out") = py::none(),
           py::arg("source") = py::none(),
           "Runs a pipeline on a contiguous buffer (GIL released); returns whether every rank's header agreed "
           "(true without one). With out (and a header): the small collective, run on a private copy of the "
           "buffer, its result written to out only if every rank agreed. With source (no header): out of "
           "place, the buffer filled from source block by block as the blocks start.");
}
