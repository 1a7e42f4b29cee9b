// Python bindings of the GPU pieces: the CUDA driver, ddl-owned device and pinned buffers, NCCL and one rank's
// NCCL group. Python decides the staging (ddl.gpu); these calls only queue work or wait, with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>

#include <cstring>

#include "ddl/cuda_driver.hpp"
#include "ddl/nccl.hpp"

namespace py = pybind11;
using namespace ddl;

namespace {

nccl::UniqueId id_from_bytes(const py::bytes& b) {
  std::string s = b;
  if (s.size() != sizeof(nccl::UniqueId))
    throw std::invalid_argument("an NCCL unique id is " + std::to_string(sizeof(nccl::UniqueId)) + " bytes, got " +
                                std::to_string(s.size()));
  nccl::UniqueId id;
  std::memcpy(id.internal, s.data(), sizeof id.internal);
  return id;
}

// DLPack's C ABI (dlpack.h, v0.x DLManagedTensor): what a "dltensor" capsule points to.
struct DLDevice { int32_t device_type, device_id; };
struct DLDataType { uint8_t code, bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

// What a capsule describes, without consuming it: the producer's deleter runs when the capsule dies, so the
// caller keeps the capsule alive while it uses the pointer.
py::dict dlpack_info(const py::capsule& cap) {
  if (std::strcmp(cap.name() ? cap.name() : "", "dltensor") != 0)
    throw std::invalid_argument("not an unconsumed DLPack capsule (name 'dltensor')");
  auto* t = static_cast<const DLTensor*>(cap.get_pointer());  // DLManagedTensor starts with its DLTensor
  py::list shape, strides;
  for (int32_t d = 0; d < t->ndim; ++d) {
    shape.append(t->shape[d]);
    if (t->strides) strides.append(t->strides[d]);
  }
  py::dict out;
  out["ptr"] = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  out["device_type"] = t->device.device_type;
  out["device_id"] = t->device.device_id;
  out["shape"] = py::tuple(shape);
  out["strides"] = t->strides ? py::object(py::tuple(strides)) : py::object(py::none());
  out["code"] = t->dtype.code;
  out["bits"] = t->dtype.bits;
  out["lanes"] = t->dtype.lanes;
  return out;
}

// Whether the MPI library in this process passes device pointers itself: Open MPI's MPIX_Query_cuda_support,
// MPICH's MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA = 0). Looked up at run time, as neither is standard.
// 1 yes, 0 no, -1 the library does not say.
int mpi_cuda_support() {
  using OpenMpiQuery = int (*)();
  using MpichQuery = int (*)(int, int*);
  if (auto q = reinterpret_cast<OpenMpiQuery>(dlsym(RTLD_DEFAULT, "MPIX_Query_cuda_support"))) return q() ? 1 : 0;
  if (auto q = reinterpret_cast<MpichQuery>(dlsym(RTLD_DEFAULT, "MPIX_GPU_query_support"))) {
    int yes = 0;
    return q(0, &yes) == 0 ? (yes ? 1 : 0) : -1;
  }
  return -1;
}

}  // namespace

void bind_device(py::module_& m) {
  m.def("dlpack_info", &dlpack_info, py::arg("capsule"),
        "ptr, device_type, device_id, shape, strides (elements, None: C order), code, bits, lanes of a capsule.");

  m.def("mpi_cuda_support", &mpi_cuda_support,
        "1 if the MPI in this process is CUDA-aware, 0 if not, -1 if it does not say (query it after MPI_Init).");

  py::class_<cuda::Driver, std::shared_ptr<cuda::Driver>>(m, "CudaDriver")
      .def(py::init<const std::string&>(), py::arg("path"), "Loads libcuda (dlopen) and initialises it.")
      .def_readonly("version", &cuda::Driver::version)
      .def_readonly("devices", &cuda::Driver::devices);

  py::class_<cuda::DeviceBuffer, std::shared_ptr<cuda::DeviceBuffer>>(m, "DeviceBuffer")
      .def(py::init<std::shared_ptr<cuda::Driver>, int, size_t>(), py::arg("driver"), py::arg("device"),
           py::arg("nbytes"))
      .def_property_readonly("ptr", [](const cuda::DeviceBuffer& b) { return static_cast<uintptr_t>(b.ptr()); })
      .def_property_readonly("nbytes", &cuda::DeviceBuffer::size);

  py::class_<cuda::PinnedBuffer, std::shared_ptr<cuda::PinnedBuffer>>(m, "PinnedBuffer", py::buffer_protocol())
      .def(py::init<std::shared_ptr<cuda::Driver>, size_t>(), py::arg("driver"), py::arg("nbytes"))
      .def_property_readonly("ptr", [](const cuda::PinnedBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("nbytes", &cuda::PinnedBuffer::size)
      .def_buffer([](cuda::PinnedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1});
      });

  py::class_<nccl::Library, std::shared_ptr<nccl::Library>>(m, "NcclLibrary")
      .def(py::init<const std::string&>(), py::arg("path"), "Loads libnccl (dlopen) and checks its version.")
      .def_readonly("version", &nccl::Library::version)
      .def("unique_id", [](nccl::Library& lib) {
        nccl::UniqueId id;
        nccl::Result rc = lib.ncclGetUniqueId(&id);
        if (rc != nccl::kSuccess) throw DeviceError("ncclGetUniqueId failed: " + lib.error_text(rc, nullptr));
        return py::bytes(id.internal, sizeof id.internal);
      }, "A new group's id: made by one member, handed to the others over MPI.");

  using G = nccl::Group;
  py::class_<G, std::shared_ptr<G>>(m, "NcclGroup")
      .def(py::init([](std::shared_ptr<nccl::Library> lib, std::shared_ptr<cuda::Driver> drv, int device,
                       const py::bytes& id, int nranks, int rank, double timeout, std::shared_ptr<G> streams_of) {
             nccl::UniqueId uid = id_from_bytes(id);
             py::gil_scoped_release nogil;
             return std::make_shared<G>(lib, drv, device, uid, nranks, rank, timeout,
                                        streams_of ? streams_of->streams() : nullptr);
           }),
           py::arg("library"), py::arg("driver"), py::arg("device"), py::arg("unique_id"), py::arg("nranks"),
           py::arg("rank"), py::arg("timeout"), py::arg("streams_of") = nullptr,
           "Joins the group of unique_id; streams_of: a group whose streams this one queues on (else its own).")
      .def("split", [](std::shared_ptr<G> self, int color, int key) { return G::split(self, color, key); },
           py::arg("color"), py::arg("key"), py::call_guard<py::gil_scoped_release>(),
           "ncclCommSplit (every member calls it): the group of this color's members by key, on the same streams; "
           "None for a negative color.")
      .def_property_readonly("can_split", &G::can_split)
      .def("group_start", &G::group_start, py::call_guard<py::gil_scoped_release>())
      .def("group_end", &G::group_end, py::arg("what"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("nranks", &G::nranks)
      .def_property_readonly("rank", &G::rank)
      .def_property_readonly("device", &G::device)
      .def_property_readonly("broken", &G::broken)
      .def("after", &G::after, py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("before", &G::before, py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("copy_dd", &G::copy_dd, py::arg("dst"), py::arg("src"), py::arg("nbytes"),
           py::call_guard<py::gil_scoped_release>())
      .def("reduce_scatter", &G::reduce_scatter, py::arg("send"), py::arg("recv"), py::arg("count"),
           py::arg("dtype"), py::arg("op"), py::arg("average"), py::call_guard<py::gil_scoped_release>())
      .def("all_gather", &G::all_gather, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
           py::call_guard<py::gil_scoped_release>())
      .def("all_reduce", &G::all_reduce, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
           py::arg("op"), py::arg("average"), py::call_guard<py::gil_scoped_release>())
      .def("broadcast", &G::broadcast, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
           py::arg("root"), py::call_guard<py::gil_scoped_release>())
      .def("copies_after_work", &G::copies_after_work, py::call_guard<py::gil_scoped_release>())
      .def("to_host", [](G& g, uintptr_t host, uintptr_t dev, size_t n) {
        return g.to_host(reinterpret_cast<void*>(host), dev, n);
      }, py::arg("host"), py::arg("dev"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def("to_device", [](G& g, uintptr_t dev, uintptr_t host, size_t n) {
        return g.to_device(dev, reinterpret_cast<const void*>(host), n);
      }, py::arg("dev"), py::arg("host"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def("wait", &G::wait, py::arg("ticket"), py::arg("what"), py::call_guard<py::gil_scoped_release>())
      .def("work_after_copies", &G::work_after_copies, py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &G::synchronize, py::arg("what"), py::call_guard<py::gil_scoped_release>());
}
