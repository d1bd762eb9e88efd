// Helpers for the nn and optim bindings: float32/float64 dispatch, shape checks and optional arrays, all
// raising ValueError "[op] ..." that names the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "array_args.h"

namespace sparkgrad::bindings {

using Shape = std::vector<std::int64_t>;

inline Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

inline std::string shape_text(const Shape& s) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
  out << (s.size() == 1 ? ",)" : ")");
  return out.str();
}

// Calls fn(T{}) with T = float or double after the dtype of `ref` (argument `name`).
template <typename Fn>
decltype(auto) dispatch_float(const char* op, const char* name, const py::handle& ref, Fn&& fn) {
  if (!py::isinstance<py::array>(ref)) {
    throw_invalid(op, name, " must be a numpy array, got ", std::string(py::str(py::type::of(ref))));
  }
  const py::dtype dtype = py::reinterpret_borrow<py::array>(ref).dtype();
  if (has_dtype<float>(dtype)) return fn(float{});
  if (has_dtype<double>(dtype)) return fn(double{});
  throw_invalid(op, name, " must be float32 or float64, got ", std::string(py::str(dtype)));
}

template <typename A>
void require_shape(const char* op, const char* name, const A& a, const Shape& expected) {
  if (shape_of(a) != expected) {
    throw_invalid(op, name, " must have shape ", shape_text(expected), ", got ", shape_text(shape_of(a)));
  }
}

template <typename A>
void require_ndim(const char* op, const char* name, const A& a, std::initializer_list<py::ssize_t> allowed,
                  const char* layout) {
  for (py::ssize_t d : allowed) {
    if (a.ndim() == d) return;
  }
  throw_invalid(op, name, " must be ", layout, ", got shape ", shape_text(shape_of(a)));
}

// Data pointer of an optional array argument (None -> nullptr), checked like checked_array.
template <typename T>
const T* optional_data(const char* op, const char* name, const py::object& arr,
                       py::array_t<T, py::array::c_style>* keep) {
  if (arr.is_none()) return nullptr;
  *keep = checked_array<T>(op, name, arr);
  return keep->data();
}

inline void require_positive(const char* op, const char* name, std::int64_t v) {
  if (v < 1) throw_invalid(op, name, " must be >= 1, got ", v);
}
inline void require_non_negative(const char* op, const char* name, std::int64_t v) {
  if (v < 0) throw_invalid(op, name, " must be >= 0, got ", v);
}

}  // namespace sparkgrad::bindings
