// Build information, threading control and the BLAS GEMM entry point.
#include <omp.h>

#include "array_args.h"

namespace py = pybind11;
using namespace sparkgrad;
using sparkgrad::bindings::checked_array;
using sparkgrad::bindings::has_dtype;

namespace {

// c = alpha * op(a) @ op(b) + beta * c; a, b: 2-D C-contiguous arrays of one float dtype.
template <typename T>
py::array gemm_typed(const py::array& a_in, const py::array& b_in, bool trans_a, bool trans_b, double alpha,
                     double beta, const py::object& out) {
  auto a = checked_array<T>("gemm", "a", a_in);
  auto b = checked_array<T>("gemm", "b", b_in);
  if (a.ndim() != 2 || b.ndim() != 2) throw_invalid("gemm", "a and b must be 2-D");
  const std::int64_t m = trans_a ? a.shape(1) : a.shape(0);
  const std::int64_t k = trans_a ? a.shape(0) : a.shape(1);
  const std::int64_t kb = trans_b ? b.shape(1) : b.shape(0);
  const std::int64_t n = trans_b ? b.shape(0) : b.shape(1);
  if (k != kb) throw_invalid("gemm", "inner dimensions differ: op(a) is (", m, ", ", k, "), op(b) is (", kb, ", ", n, ")");
  py::array_t<T, py::array::c_style> c;
  if (out.is_none()) {
    if (beta != 0.0) throw_invalid("gemm", "beta != 0 needs an `out` array to accumulate into");
    c = py::array_t<T, py::array::c_style>({m, n});
  } else {
    c = checked_array<T>("gemm", "out", out, /*writable=*/true);
    if (c.ndim() != 2 || c.shape(0) != m || c.shape(1) != n) {
      throw_invalid("gemm", "out must have shape (", m, ", ", n, ")");
    }
  }
  const T* pa = a.data();
  const T* pb = b.data();
  T* pc = c.mutable_data();
  const std::int64_t lda = a.shape(1), ldb = b.shape(1);
  {
    py::gil_scoped_release release;
    gemm<T>(trans_a ? Transpose::Yes : Transpose::No, trans_b ? Transpose::Yes : Transpose::No, m, n, k,
            static_cast<T>(alpha), pa, lda, pb, ldb, static_cast<T>(beta), pc, n);
  }
  return std::move(c);
}

}  // namespace

void init_common(py::module_& m) {
  m.def("max_threads", &max_threads, "Number of OpenMP threads native kernels use.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Set the OpenMP and OpenBLAS thread counts for this process.");
  m.def("blas_info", &blas_info, "OpenBLAS configuration string.");
  m.def("cuda_available", &cuda_available, "True if built with CUDA and a GPU is visible.");
  m.def("openmp_version", []() { return _OPENMP; }, "The OpenMP specification date the core was built with.");
  m.def(
      "gemm",
      [](const py::array& a, const py::array& b, bool trans_a, bool trans_b, double alpha, double beta,
         const py::object& out) -> py::array {
        if (has_dtype<float>(a.dtype())) return gemm_typed<float>(a, b, trans_a, trans_b, alpha, beta, out);
        if (has_dtype<double>(a.dtype())) return gemm_typed<double>(a, b, trans_a, trans_b, alpha, beta, out);
        throw_invalid("gemm", "a must be float32 or float64, got ", std::string(py::str(a.dtype())));
      },
      py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("alpha") = 1.0,
      py::arg("beta") = 0.0, py::arg("out") = py::none(),
      "Row-major GEMM through OpenBLAS: alpha * op(a) @ op(b) + beta * out.");
}
