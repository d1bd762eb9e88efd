// Helpers of the nn, optim and common bindings: float32/float64 dispatch, the call of the CPU or CUDA twin
// for the arrays' device, and scalar checks, all raising "[op] ..." errors that name the argument.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "array_args.h"

namespace sparkgrad::bindings {

// Calls fn(T{}) with T = float or double after the dtype of `ref`.
template <typename Fn>
decltype(auto) dispatch_float(const char* op, const ArrayView& ref, Fn&& fn) {
  if (ref.dtype() == Dtype::Float32) return fn(float{});
  if (ref.dtype() == Dtype::Float64) return fn(double{});
  throw_invalid(op, ref.name(), " must be float32 or float64, got ", ref.dtype_text());
}

// Runs cpu() for host arrays, gpu() for device arrays (on the caller's CuPy stream), with the GIL released.
template <typename Cpu, typename Gpu>
void run_on(const Place& place, Cpu&& cpu, Gpu&& gpu) {
  if (place.gpu) {
    use_callers_stream();
    py::gil_scoped_release release;
    gpu();
  } else {
    py::gil_scoped_release release;
    cpu();
  }
}

// area::fn(args...) for host arrays, area::cuda::fn(args...) for device arrays: the twins share one
// declaration (cpp/include/sparkgrad/<area>.h), so one argument list serves both.
#define SPARKGRAD_RUN_TWIN(place, area, fn, ...) \
  ::sparkgrad::bindings::run_on((place), [&] { area::fn(__VA_ARGS__); }, [&] { area::cuda::fn(__VA_ARGS__); })

inline void require_positive(const char* op, const char* name, std::int64_t v) {
  if (v < 1) throw_invalid(op, name, " must be >= 1, got ", v);
}
inline void require_non_negative(const char* op, const char* name, std::int64_t v) {
  if (v < 0) throw_invalid(op, name, " must be >= 0, got ", v);
}

}  // namespace sparkgrad::bindings
