// ArrayView: one array argument read from whatever kind of array the caller passed (array_args.h).
#include "array_args.h"

#include <sstream>
#include <utility>

#include "dlpack.h"

namespace sparkgrad::bindings {

// The dtype checks read '<', '=' and '|' as the native byte order and '>' as a foreign one.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "sparkgrad's bindings assume a little-endian host");

std::string shape_text(const Shape& s) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
  out << (s.size() == 1 ? ",)" : ")");
  return out.str();
}

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::Float32: return "float32";
    case Dtype::Float64: return "float64";
    case Dtype::Int32: return "int32";
    case Dtype::Int64: return "int64";
    case Dtype::UInt8: return "uint8";
    default: return "unknown";
  }
}

namespace {

// CuPy's ndarray type where CuPy is imported, else null. Its arrays are read through their own
// attributes, which cost a fraction of building their __cuda_array_interface__ dict (looked up per call:
// a dictionary lookup, and the test suite may stand a module in for CuPy).
PyTypeObject* cupy_ndarray_type() {
  static PyObject* const key = PyUnicode_InternFromString("cupy");  // interned once, never released
  PyObject* cupy = PyDict_GetItem(PyImport_GetModuleDict(), key);  // borrowed; null, no error, if absent
  if (cupy == nullptr) return nullptr;
  PyObject* type = PyObject_GetAttrString(cupy, "ndarray");
  if (type == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  Py_DECREF(type);  // the module keeps it
  return PyType_Check(type) ? reinterpret_cast<PyTypeObject*>(type) : nullptr;
}

// Whether strides (in bytes) lay out `shape` in C order; axes of length 1 may have any stride.
bool c_order(const Shape& shape, const std::vector<std::int64_t>& strides, std::int64_t itemsize) {
  for (std::int64_t s : shape) {
    if (s == 0) return true;  // no elements: any layout will do
  }
  std::int64_t expected = itemsize;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Shape shape_of_sequence(py::handle seq) {
  Shape out;
  for (py::handle s : seq) out.push_back(s.cast<std::int64_t>());
  return out;
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

}  // namespace

std::uintptr_t callers_stream() {
  // cupy.cuda.get_current_stream, or None where CuPy cannot be imported
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> storage;
  const py::object& current = storage
                                  .call_once_and_store_result([]() -> py::object {
                                    try {
                                      return py::module_::import("cupy").attr("cuda").attr("get_current_stream");
                                    } catch (py::error_already_set& e) {
                                      if (!e.matches(PyExc_ImportError)) throw;
                                      return py::none();
                                    }
                                  })
                                  .get_stored();
  return current.is_none() ? 0 : current().attr("ptr").cast<std::uintptr_t>();
}

void use_callers_stream() {
  if (gpu::built()) gpu::set_stream(callers_stream());  // without CUDA the stand-ins refuse the op
}

ArrayView::ArrayView(const char* op, std::string name, py::handle obj) : op_(op), name_(std::move(name)) {
  auto& api = py::detail::npy_api::get();
  if (api.PyArray_Check_(obj.ptr())) {
    read_numpy(obj);
    return;
  }
  if (PyTypeObject* cupy = cupy_ndarray_type(); cupy != nullptr && PyObject_TypeCheck(obj.ptr(), cupy)) {
    read_cupy(obj);
    return;
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    // NumPy's view of a memoryview of the buffer: never a copy (NumPy would copy a NumPy scalar given
    // itself), read-only where the buffer is
    const auto view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(obj.ptr()));
    if (!view) throw py::error_already_set();
    keep_ = py::reinterpret_steal<py::object>(api.PyArray_FromAny_(view.ptr(), nullptr, 0, 0, 0, nullptr));
    if (!keep_) throw py::error_already_set();
    read_numpy(keep_);
    return;
  }
  const py::object cai = py::getattr(obj, "__cuda_array_interface__", py::none());
  if (py::isinstance<py::dict>(cai)) {
    read_cuda_interface(py::reinterpret_borrow<py::dict>(cai));
    return;
  }
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    read_dlpack(obj);
    return;
  }
  throw py::type_error(op_message(op_, name_, " must be an array (NumPy, CuPy, __cuda_array_interface__, DLPack or ",
                                  "buffer), got ", type_name(obj)));
}

ArrayView ArrayView::optional(const char* op, std::string name, py::handle obj) {
  if (!obj.is_none()) return ArrayView(op, std::move(name), obj);
  ArrayView absent(op, std::move(name));
  absent.present_ = false;
  return absent;
}

std::int64_t ArrayView::size() const {
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

void ArrayView::require_shape(const Shape& expected) const {
  if (present_ && shape_ != expected) {
    throw_invalid(op_, name_, " must have shape ", shape_text(expected), ", got ", shape_text(shape_));
  }
}

void ArrayView::require_ndim(std::initializer_list<std::int64_t> allowed, const char* layout) const {
  for (std::int64_t d : allowed) {
    if (ndim() == d) return;
  }
  throw_invalid(op_, name_, " must be ", layout, ", got shape ", shape_text(shape_));
}

void ArrayView::set_dtype(const py::dtype& dt) {
  itemsize_ = dt.itemsize();
  const char kind = dt.kind();
  if (dt.byteorder() != '>') {
    if (kind == 'f' && itemsize_ == 4) dtype_ = Dtype::Float32;
    if (kind == 'f' && itemsize_ == 8) dtype_ = Dtype::Float64;
    if (kind == 'i' && itemsize_ == 4) dtype_ = Dtype::Int32;
    if (kind == 'i' && itemsize_ == 8) dtype_ = Dtype::Int64;
    if (kind == 'u' && itemsize_ == 1) dtype_ = Dtype::UInt8;
  }
  if (dtype_ == Dtype::Other) other_dtype_ = py::str(dt);
}

void ArrayView::read_numpy(py::handle arr) {
  const auto a = py::reinterpret_borrow<py::array>(arr);
  data_ = py::detail::array_proxy(arr.ptr())->data;
  shape_.assign(a.shape(), a.shape() + a.ndim());
  set_dtype(a.dtype());
  c_contiguous_ = (a.flags() & py::array::c_style) != 0;
  writable_ = a.writeable();
}

void ArrayView::read_cupy(py::handle arr) {
  data_ = reinterpret_cast<void*>(arr.attr("data").attr("ptr").cast<std::uintptr_t>());
  shape_ = shape_of_sequence(arr.attr("shape"));
  set_dtype(py::reinterpret_borrow<py::dtype>(arr.attr("dtype")));
  c_contiguous_ = arr.attr("flags").attr("c_contiguous").cast<bool>();
  place_ = {true, arr.attr("device").attr("id").cast<int>()};  // CuPy arrays are never read-only
}

void ArrayView::read_cuda_interface(const py::dict& cai) {
  // version 2 or 3 (3 adds "stream": the ops run on the caller's stream, see use_callers_stream)
  if (cai.contains("mask") && !cai["mask"].is_none()) {
    throw py::type_error(op_message(op_, name_, " is a masked __cuda_array_interface__ array, which kernels cannot take"));
  }
  shape_ = shape_of_sequence(cai["shape"]);
  set_dtype(py::dtype(std::string(py::str(cai["typestr"]))));
  const auto data = cai["data"].cast<py::tuple>();
  data_ = reinterpret_cast<void*>(data[0].cast<std::uintptr_t>());
  writable_ = !data[1].cast<bool>();
  const py::object strides = cai.contains("strides") ? py::object(cai["strides"]) : py::object(py::none());
  if (!strides.is_none()) c_contiguous_ = c_order(shape_, shape_of_sequence(strides), itemsize_);
  place_ = {true, -1};
}

void ArrayView::read_dlpack(py::handle obj) {
  namespace dl = dlpack;
  const auto device = obj.attr("__dlpack_device__")().cast<py::tuple>();
  const auto device_type = device[0].cast<std::int32_t>();
  const bool gpu = device_type == dl::kDLCUDA || device_type == dl::kDLCUDAManaged;
  if (!gpu && device_type != dl::kDLCPU && device_type != dl::kDLCUDAHost) {
    throw py::type_error(op_message(op_, name_, " is on DLPack device type ", device_type,
                                    ", neither the CPU nor a CUDA GPU"));
  }
  // A GPU producer makes its data ready for the stream the op will run on (1 names the legacy default
  // stream, since 0 is reserved); on the host there is no stream.
  py::object stream = py::none();
  if (gpu && gpu::built()) {
    const std::uintptr_t s = callers_stream();
    stream = py::int_(s == 0 ? 1 : s);
  }
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream, py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;  // a producer from before DLPack 1.0 takes no max_version
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream);
  }
  const dl::DLTensor* t = nullptr;
  std::uint64_t flags = 0;
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    const auto* m = static_cast<dl::DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    if (m->version.major != 1) {
      throw py::type_error(op_message(op_, name_, " is a DLPack ", m->version.major, ".x tensor; sparkgrad reads 1.x"));
    }
    t = &m->dl_tensor;
    flags = m->flags;
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    t = &static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
  } else {
    throw py::type_error(op_message(op_, name_, ".__dlpack__() returned no DLPack capsule"));
  }
  // The capsule is not consumed: while kept here it owns the tensor, and its destructor (the
  // producer's) frees it with the view.
  keep_ = std::move(capsule);
  data_ = static_cast<char*>(t->data) + t->byte_offset;
  shape_.assign(t->shape, t->shape + t->ndim);
  const dl::DLDataType dt = t->dtype;
  itemsize_ = (dt.bits / 8) * dt.lanes;
  if (dt.lanes == 1 && dt.code == dl::kDLFloat && dt.bits == 32) dtype_ = Dtype::Float32;
  if (dt.lanes == 1 && dt.code == dl::kDLFloat && dt.bits == 64) dtype_ = Dtype::Float64;
  if (dt.lanes == 1 && dt.code == dl::kDLInt && dt.bits == 32) dtype_ = Dtype::Int32;
  if (dt.lanes == 1 && dt.code == dl::kDLInt && dt.bits == 64) dtype_ = Dtype::Int64;
  if (dt.lanes == 1 && dt.code == dl::kDLUInt && dt.bits == 8) dtype_ = Dtype::UInt8;
  if (dtype_ == Dtype::Other) {
    std::ostringstream text;
    text << "DLPack type code " << int(dt.code) << " (" << int(dt.bits) << " bits x " << dt.lanes << ")";
    other_dtype_ = text.str();
  }
  if (t->strides != nullptr) {
    std::vector<std::int64_t> strides(t->strides, t->strides + t->ndim);
    for (auto& s : strides) s *= itemsize_;
    c_contiguous_ = c_order(shape_, strides, itemsize_);
  }
  // DLPack before 1.0 cannot say read-only (NumPy refuses to export a read-only array that way)
  writable_ = (flags & (dl::kFlagReadOnly | dl::kFlagIsCopied)) == 0;
  place_ = {gpu, gpu ? t->device.device_id : -1};
}

namespace {

std::string place_text(const Place& p) {
  if (!p.gpu) return "a host array";
  return p.ordinal < 0 ? std::string("on a GPU") : "on cuda:" + std::to_string(p.ordinal);
}

template <typename Views>
Place common_place_of(const char* op, const Views& views) {
  const ArrayView* first = nullptr;
  Place place;
  for (const ArrayView* v : views) {
    if (!v->present()) continue;
    const Place& p = v->place();
    if (first == nullptr) {
      first = v;
      place = p;
      continue;
    }
    if (p.gpu != place.gpu || (p.gpu && p.ordinal >= 0 && place.ordinal >= 0 && p.ordinal != place.ordinal)) {
      throw py::type_error(op_message(op, v->name(), " is ", place_text(p), " but ", first->name(), " is ",
                                      place_text(place), ": every array of one call must be on the same device"));
    }
    if (place.ordinal < 0) place.ordinal = p.ordinal;
  }
  return place;
}

}  // namespace

Place common_place(const char* op, std::initializer_list<const ArrayView*> views) {
  return common_place_of(op, views);
}

Place common_place(const char* op, const std::vector<const ArrayView*>& views) {
  return common_place_of(op, views);
}

}  // namespace sparkgrad::bindings
