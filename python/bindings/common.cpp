// Build information, threading control, the GPU inventory and stream, and the GEMM front door (OpenBLAS
// for host arrays, cuBLAS for device arrays).
#include <omp.h>

#include "kernel_args.h"

namespace py = pybind11;
using namespace sparkgrad;
using namespace sparkgrad::bindings;

namespace {

// c = alpha * op(a) @ op(b) + beta * c; a, b: 2-D C-contiguous arrays of one float dtype on one device.
// Without `out` (only with beta == 0) c is a new array of the inputs' kind: NumPy, or CuPy on a GPU.
py::object gemm_binding(py::handle a_in, py::handle b_in, bool trans_a, bool trans_b, double alpha, double beta,
                py::handle out) {
  const char* op = "gemm";
  const ArrayView a(op, "a", a_in), b(op, "b", b_in);
  const Place place = common_place(op, {&a, &b});
  return dispatch_float(op, a, [&](auto tag) -> py::object {
    using T = decltype(tag);
    a.require<T>();
    b.require<T>();
    if (a.ndim() != 2 || b.ndim() != 2) throw_invalid(op, "a and b must be 2-D");
    const std::int64_t m = trans_a ? a.shape(1) : a.shape(0);
    const std::int64_t k = trans_a ? a.shape(0) : a.shape(1);
    const std::int64_t kb = trans_b ? b.shape(1) : b.shape(0);
    const std::int64_t n = trans_b ? b.shape(0) : b.shape(1);
    if (k != kb) throw_invalid(op, "inner dimensions differ: op(a) is (", m, ", ", k, "), op(b) is (", kb, ", ", n, ")");
    py::object c_obj = py::reinterpret_borrow<py::object>(out);
    if (out.is_none()) {
      if (beta != 0.0) throw_invalid(op, "beta != 0 needs an `out` array to accumulate into");
      c_obj = place.gpu ? py::module_::import("cupy").attr("empty")(py::make_tuple(m, n), py::dtype::of<T>())
                        : py::object(py::array_t<T, py::array::c_style>({m, n}));
    }
    const ArrayView c(op, "out", c_obj);
    common_place(op, {&a, &c});
    c.require<T>(true);
    if (c.shape() != Shape{m, n}) throw_invalid(op, "out must have shape (", m, ", ", n, ")");
    const Transpose ta = trans_a ? Transpose::Yes : Transpose::No, tb = trans_b ? Transpose::Yes : Transpose::No;
    const auto run = [&](auto gemm_on) {
      gemm_on(ta, tb, m, n, k, static_cast<T>(alpha), a.data<T>(), a.shape(1), b.data<T>(), b.shape(1),
              static_cast<T>(beta), c.mutable_data<T>(), n);
    };
    run_on(place, [&] { run(&sparkgrad::gemm<T>); }, [&] { run(&gpu::gemm<T>); });
    return c_obj;
  });
}

}  // namespace

void init_common(py::module_& m) {
  m.def("max_threads", &max_threads, "Number of OpenMP threads native kernels use.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Set the OpenMP and OpenBLAS thread counts for this process.");
  m.def("blas_info", &blas_info, "OpenBLAS configuration string.");
  m.def("cuda_available", &cuda_available, "True if built with CUDA and a GPU is visible.");
  m.def("openmp_version", []() { return _OPENMP; }, "The OpenMP specification date the core was built with.");
  m.def("cuda_built", &gpu::built, "True in a CUDA build of the extension.");
  m.def(
      "cuda_set_stream", [](std::uintptr_t stream) { gpu::set_stream(stream); }, py::arg("stream"),
      "Runs the calling thread's CUDA ops on the current device on this stream (a raw cudaStream_t). The kernels "
      "take CuPy's current stream themselves; the compress codecs' raw cuda_* entry points need this first "
      "(sparkgrad.cuda.launch). No-op in the CPU build.");
  m.def("cuda_set_sync_each_op", &gpu::set_sync_each_op, py::arg("on"),
        "Debug switch: every CUDA op waits for the device before it returns.");
  m.def("cuda_sync_each_op", &gpu::sync_each_op, "Whether every CUDA op waits for the device.");
  m.def(
      "cuda_devices",
      []() {
        py::list out;
        for (const auto& d : gpu::devices()) {
          py::dict info;
          info["index"] = d.index;
          info["name"] = d.name;
          info["compute_capability"] = py::make_tuple(d.major, d.minor);
          info["total_memory"] = d.total_memory;
          out.append(info);
        }
        return out;
      },
      "The GPUs the CUDA runtime sees: index, name, compute_capability, total_memory (bytes).");
  m.def("gemm", &gemm_binding, py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false,
        py::arg("alpha") = 1.0, py::arg("beta") = 0.0, py::arg("out") = py::none(),
        "Row-major GEMM: alpha * op(a) @ op(b) + beta * out, through OpenBLAS for host arrays and cuBLAS for "
        "device arrays. Without out (beta == 0 only) returns a new array (NumPy, or CuPy on a GPU).");
}
