// Python bindings of the executor: ddl._native. Python builds plans; this runs them with the GIL released.
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ddl/executor.hpp"
#include "ddl/loopback.hpp"
#include "ddl/mpi_transport.hpp"
#include "ddl/staging.hpp"

namespace py = pybind11;
using namespace ddl;

void bind_device(py::module_& m);  // device_bindings.cpp: CUDA driver, buffers, NCCL

namespace {

using Rows = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

Program program_from_rows(const Rows& rows, int64_t scratch_elems, int32_t tags) {
  if (rows.ndim() != 2 || (rows.shape(0) && rows.shape(1) != 8))
    throw std::invalid_argument("program rows must have shape (n, 8)");
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

struct PyPlan {
  Plan plan;
  int64_t extent = 0;
};

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

RunOptions run_options(DType dtype, ReduceOp op, double timeout, const std::string& label) {
  RunOptions opt;
  opt.dtype = dtype;
  opt.op = op;
  opt.timeout_s = timeout;
  opt.label = label;
  return opt;
}

// Header mode: messages carry {h0, h1}, merged by max; receives accept `capacity` bytes of payload.
RunOptions header_options(DType dtype, ReduceOp op, double timeout, const std::string& label, int64_t h0,
                          int64_t h1, int64_t capacity) {
  RunOptions opt = run_options(dtype, op, timeout, label);
  opt.header_mode = true;
  opt.header[0] = h0;
  opt.header[1] = h1;
  opt.header_capacity = capacity;
  return opt;
}

void run_plan(Executor& ex, const PyPlan& plan, const py::buffer& buf, RunOptions& opt) {
  void* ptr = writable_buffer(buf, opt.dtype, plan.extent);
  py::gil_scoped_release nogil;  // the buffer stays alive: the caller holds it
  ex.run(plan.plan, ptr, opt);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  // mpi4py's C API is imported on first use, not here: importing it initialises MPI, which a process that
  // runs alone (and `import ddl`) should not pay for.
  m.doc() = "ddl's native executor: runs compiled schedules over MPI or an in-process loopback.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TransportError& e) {
      py::object cls = py::module_::import("ddl.errors").attr("TransportError");
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  py::enum_<DType>(m, "DType")
      .value("float16", DType::float16).value("bfloat16", DType::bfloat16)
      .value("float32", DType::float32).value("float64", DType::float64)
      .value("int32", DType::int32).value("int64", DType::int64).value("uint8", DType::uint8);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum).value("prod", ReduceOp::prod)
      .value("min", ReduceOp::min).value("max", ReduceOp::max);
  bind_device(m);

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

  py::class_<Program>(m, "Program")
      .def(py::init(&program_from_rows), py::arg("rows"), py::arg("scratch_elems"), py::arg("tags"),
           "rows: int64 (n, 8) = kind, peer, round, tag, offset, count, scratch, wait_sends; sorted by round.")
      .def_property_readonly("nsteps", [](const Program& p) { return p.steps.size(); })
      .def_property_readonly("nrounds", [](const Program& p) { return p.round_begin.size() - 1; });

  py::class_<PyPlan>(m, "Plan")
      .def(py::init(&make_plan), py::arg("programs"), py::arg("blocks"), py::arg("inflight"))
      .def_property_readonly("extent", [](const PyPlan& p) { return p.extent; })
      .def_property_readonly("nblocks", [](const PyPlan& p) { return p.plan.blocks.size(); });

  py::class_<LoopbackHub, std::shared_ptr<LoopbackHub>>(m, "LoopbackHub")
      .def(py::init<int>(), py::arg("size"))
      .def_property_readonly("size", &LoopbackHub::size);

  py::class_<Executor>(m, "Executor")
      .def_static("mpi", [](py::handle comm) {
        if (import_mpi4py() < 0) throw py::error_already_set();
        MPI_Comm* c = PyMPIComm_Get(comm.ptr());
        if (c == nullptr) throw py::error_already_set();
        return std::make_unique<Executor>(std::make_shared<MpiTransport>(*c));
      }, py::arg("comm"), "Executor over an mpi4py communicator (keep the communicator alive).")
      .def_static("loopback", [](std::shared_ptr<LoopbackHub> hub, int rank) {
        if (rank < 0 || rank >= hub->size()) throw std::invalid_argument("rank outside the hub");
        return std::make_unique<Executor>(std::make_shared<LoopbackTransport>(hub, rank));
      }, py::arg("hub"), py::arg("rank"))
      .def_property_readonly("rank", [](Executor& e) { return e.transport().rank(); })
      .def_property_readonly("size", [](Executor& e) { return e.transport().size(); })
      .def_property_readonly("transport", [](Executor& e) { return e.transport().name(); })
      .def_property_readonly("broken", &Executor::broken)
      .def("run", [](Executor& ex, const PyPlan& plan, const py::buffer& buf, DType dtype, ReduceOp op,
                     double timeout, const std::string& label) {
        RunOptions opt = run_options(dtype, op, timeout, label);
        run_plan(ex, plan, buf, opt);
      }, py::arg("plan"), py::arg("buf"), py::arg("dtype"), py::arg("op"), py::arg("timeout"), py::arg("label"))
      .def("run_header", [](Executor& ex, const PyPlan& plan, const py::buffer& buf, DType dtype, ReduceOp op,
                            double timeout, const std::string& label, int64_t h0, int64_t h1, int64_t capacity) {
        RunOptions opt = header_options(dtype, op, timeout, label, h0, h1, capacity);
        run_plan(ex, plan, buf, opt);
        return py::make_tuple(opt.header[0], opt.header[1]);
      }, py::arg("plan"), py::arg("buf"), py::arg("dtype"), py::arg("op"), py::arg("timeout"), py::arg("label"),
         py::arg("h0"), py::arg("h1"), py::arg("capacity"),
         "Runs a plan whose messages carry a 2 x int64 header merged by max; returns the merged header.")
      .def("run_staged", [](Executor& ex, const PyPlan& plan, nccl::Group& group, uintptr_t device,
                            const py::buffer& host, DType dtype, ReduceOp op, double factor, double timeout,
                            const std::string& label) {
        char* staging = static_cast<char*>(writable_buffer(host, dtype, plan.extent));
        RunOptions opt = run_options(dtype, op, timeout, label);
        py::gil_scoped_release nogil;
        run_staged(ex, group, plan.plan, device, staging, opt, factor);
      }, py::arg("plan"), py::arg("group"), py::arg("device"), py::arg("host"), py::arg("dtype"), py::arg("op"),
         py::arg("factor"), py::arg("timeout"), py::arg("label"),
         "The plan over a GPU block staged through pinned `host`: each pipeline block copied in when the plan "
         "reaches it, scaled by factor and copied back as soon as it is reduced (ddl.gpu).")
      .def("run_small", [](Executor& ex, const PyPlan& plan, const py::buffer& src, const py::buffer& dst,
                           DType dtype, ReduceOp op, double timeout, const std::string& label, int64_t hash,
                           int64_t capacity, double factor) {
        const int64_t n = elements(src, dtype);
        if (n != plan.extent && !(n == 0 && plan.extent == 0))
          throw std::invalid_argument("source holds " + std::to_string(n) + " elements, plan moves " +
                                      std::to_string(plan.extent));
        void* out = writable_buffer(dst, dtype, n);
        const void* in = contiguous_buffer(src, dtype, n, false);
        RunOptions opt = header_options(dtype, op, timeout, label, hash, -hash, capacity);
        py::gil_scoped_release nogil;
        return ex.run_small(plan.plan, in, out, static_cast<size_t>(n) * dtype_size(dtype), factor, opt);
      }, py::arg("plan"), py::arg("src"), py::arg("dst"), py::arg("dtype"), py::arg("op"), py::arg("timeout"),
         py::arg("label"), py::arg("hash"), py::arg("capacity"), py::arg("factor"),
         "A whole small collective in one call: agreement and payload together; dst written only if all agreed.");
}
