// Argument checks shared by every binding file: arrays reach kernels as raw pointers + sizes only after
// their dtype, contiguity and writability are verified, with errors that name the op and the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "sparkgrad/common.h"

namespace sparkgrad::bindings {

namespace py = pybind11;

template <typename T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
  return "unknown";
}

// Checks that `arr` holds T in C order (and is writable when asked), without copying: kernels that
// modify arrays in place must never work on a silent copy.
// Whether dt is T's dtype: equivalence, not identity, since an unpickled array carries its own descriptor
// object for float32; a non-native byte order is not equivalent.
template <typename T>
bool has_dtype(const py::dtype& dt) {
  return py::detail::npy_api::get().PyArray_EquivTypes_(dt.ptr(), py::dtype::of<T>().ptr());
}

template <typename T>
py::array_t<T, py::array::c_style> checked_array(const char* op, const char* name, const py::handle& arr,
                                                  bool writable = false) {
  if (!py::isinstance<py::array>(arr)) {
    throw_invalid(op, name, " must be a numpy array, got ", std::string(py::str(py::type::of(arr))));
  }
  auto a = py::reinterpret_borrow<py::array>(arr);
  if (!has_dtype<T>(a.dtype())) {
    throw_invalid(op, name, " must have dtype ", dtype_name<T>(), ", got ", std::string(py::str(a.dtype())));
  }
  if (!(a.flags() & py::array::c_style)) throw_invalid(op, name, " must be C-contiguous");
  if (writable && !a.writeable()) throw_invalid(op, name, " must be writable");
  return py::reinterpret_borrow<py::array_t<T, py::array::c_style>>(a);
}

// Same as checked_array and also requires ndim == 1.
template <typename T>
py::array_t<T, py::array::c_style> checked_vector(const char* op, const char* name, const py::handle& arr,
                                                   bool writable = false) {
  auto a = checked_array<T>(op, name, arr, writable);
  if (a.ndim() != 1) throw_invalid(op, name, " must be 1-D, got ", a.ndim(), " dimensions");
  return a;
}

}  // namespace sparkgrad::bindings
