// Mixed precision: the calling thread's GEMM precision on the current GPU (cuda/common/blas.cu), which
// sparkgrad.nn sets around a network's passes. Named as the network configurations' `precision` values.
#include <pybind11/pybind11.h>

#include <string>

#include "sparkgrad/common.h"

namespace py = pybind11;
using namespace sparkgrad;

namespace {

constexpr const char* kNames[] = {"float32", "bf16", "fp16"};  // indexed by gpu::Precision

gpu::Precision parse_precision(const std::string& name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kNames[i]) return static_cast<gpu::Precision>(i);
  }
  throw_invalid("cuda_set_precision", "expected 'float32', 'bf16' or 'fp16', got '", name, "'");
}

}  // namespace

void init_precision(py::module_& m) {
  m.def(
      "cuda_set_precision", [](const std::string& name) { gpu::set_precision(parse_precision(name)); },
      py::arg("precision"),
      "Sets the calling thread's precision of float32 GEMMs on the current GPU: 'float32', 'bf16' or 'fp16' "
      "(tensor cores, operands losing at most what 16 bits lose, float32 accumulation and output). The CPU "
      "build keeps the value per thread; its kernels ignore it.");
  m.def(
      "cuda_precision", []() { return std::string(kNames[static_cast<int>(gpu::current_precision())]); },
      "The calling thread's GEMM precision on the current GPU ('float32' until set).");
}
