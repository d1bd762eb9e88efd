// Array arguments of the bindings. ArrayView is the one checked view every nn, optim and common binding
// takes its arrays through, host or device alike: arrays reach kernels as raw pointers + sizes only after
// their dtype, contiguity, shape, writability and device are verified, with errors that name the op and
// the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "sparkgrad/common.h"

namespace sparkgrad::bindings {

namespace py = pybind11;

using Shape = std::vector<std::int64_t>;

// "(2, 3)", "(4,)", "()": a shape as Python prints it.
std::string shape_text(const Shape& s);

enum class Dtype : std::uint8_t { Float32, Float64, Int32, Int64, UInt8, Other };

template <typename T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return Dtype::Float32;
  if constexpr (std::is_same_v<T, double>) return Dtype::Float64;
  if constexpr (std::is_same_v<T, std::int32_t>) return Dtype::Int32;
  if constexpr (std::is_same_v<T, std::int64_t>) return Dtype::Int64;
  if constexpr (std::is_same_v<T, std::uint8_t>) return Dtype::UInt8;
  return Dtype::Other;
}

const char* dtype_name(Dtype d);

// Where an array lives: host memory, or a GPU with its CUDA ordinal (-1 where the array does not say,
// as a bare __cuda_array_interface__ does not).
struct Place {
  bool gpu = false;
  int ordinal = -1;
};

// Pointer, shape, dtype, place and writability of one array argument, read without copying from a NumPy
// array or any object with the buffer protocol (host), a CuPy array or any object with
// __cuda_array_interface__ v2/v3 (GPU), or a DLPack producer (__dlpack__ / __dlpack_device__, CPU or
// CUDA). The object must outlive the view (the caller's argument does); a DLPack capsule is kept here.
class ArrayView {
 public:
  // Argument `name` of `op`; TypeError when `obj` is no array of a kind above.
  ArrayView(const char* op, std::string name, py::handle obj);
  // An optional argument: None gives an absent view, whose data is null and which every check skips.
  static ArrayView optional(const char* op, std::string name, py::handle obj);

  bool present() const { return present_; }
  const std::string& name() const { return name_; }
  const Place& place() const { return place_; }
  Dtype dtype() const { return dtype_; }
  std::string dtype_text() const { return dtype_ == Dtype::Other ? other_dtype_ : dtype_name(dtype_); }
  std::int64_t ndim() const { return static_cast<std::int64_t>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  std::int64_t shape(std::size_t axis) const { return shape_[axis]; }
  std::int64_t size() const;
  std::int64_t nbytes() const { return size() * itemsize_; }

  // ValueError unless the array holds T in C order (and is writable when asked): kernels that modify
  // arrays in place must never work on a silent copy.
  template <typename T>
  void require(bool writable = false) const {
    if (!present_) return;
    if (dtype_ != dtype_of<T>()) {
      throw_invalid(op_, name_, " must have dtype ", dtype_name(dtype_of<T>()), ", got ", dtype_text());
    }
    if (!c_contiguous_) throw_invalid(op_, name_, " must be C-contiguous");
    if (writable && !writable_) throw_invalid(op_, name_, " must be writable");
  }
  // ValueError unless the shape is `expected`.
  void require_shape(const Shape& expected) const;
  // ValueError unless ndim is one of `allowed`; `layout` names them ("(N, C) or (N, C, H, W)").
  void require_ndim(std::initializer_list<std::int64_t> allowed, const char* layout) const;

  // The data after require<T>() (null for an absent view); mutable_data after require<T>(true).
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  template <typename T>
  T* mutable_data() const {
    return static_cast<T*>(data_);
  }

 private:
  ArrayView(const char* op, std::string name) : op_(op), name_(std::move(name)) {}
  void read_numpy(py::handle arr);
  void read_cupy(py::handle arr);
  void read_cuda_interface(const py::dict& cai);
  void read_dlpack(py::handle obj);
  void set_dtype(const py::dtype& dt);

  const char* op_;
  std::string name_;
  bool present_ = true;
  void* data_ = nullptr;
  Shape shape_;
  Dtype dtype_ = Dtype::Other;
  std::string other_dtype_;  // the text of an Other dtype, for errors
  std::int64_t itemsize_ = 0;
  Place place_;
  bool c_contiguous_ = true;
  bool writable_ = true;
  py::object keep_;  // what owns the memory, where the caller's object does not: a DLPack capsule
};

// The place every present view shares (the host when none is present); TypeError naming the first
// argument on another device: host and device arrays never mix in one call.
Place common_place(const char* op, std::initializer_list<const ArrayView*> views);
Place common_place(const char* op, const std::vector<const ArrayView*>& views);

// The raw cudaStream_t of CuPy's current stream on the current device (0, the legacy default stream,
// where CuPy cannot be imported): where the network's CuPy operations queue, so sparkgrad's ops run in
// order with them.
std::uintptr_t callers_stream();
// Points the calling thread's CUDA ops at callers_stream() (in a CUDA build; the CPU build's stand-ins
// refuse every op themselves).
void use_callers_stream();

// compress.cpp's checks, until the compress area takes its arrays through ArrayView: NumPy arrays only.
template <typename T>
const char* dtype_name() {
  return dtype_name(dtype_of<T>());
}

// Whether dt is T's dtype: equivalence, not identity, since an unpickled array carries its own descriptor
// object for float32; a non-native byte order is not equivalent.
template <typename T>
bool has_dtype(const py::dtype& dt) {
  return py::detail::npy_api::get().PyArray_EquivTypes_(dt.ptr(), py::dtype::of<T>().ptr());
}

// Checks that `arr` holds T in C order (and is writable when asked), without copying.
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
