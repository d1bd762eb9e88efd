// Threshold-encoding codecs (sparkgrad.compress). NumPy entry points check arguments, then release the
// GIL around each native pass; cuda_* entry points take raw device pointers from CuPy arrays
// (__cuda_array_interface__) and reach cuda/compress (or the throwing stand-ins without CUDA).
#include <cmath>
#include <cstring>
#include <string>

#include "array_args.h"
#include "sparkgrad/compress.h"

namespace py = pybind11;
using namespace sparkgrad;
using namespace sparkgrad::compress;
using sparkgrad::bindings::checked_vector;
using sparkgrad::bindings::has_dtype;

namespace {

using Message = py::array_t<std::int32_t, py::array::c_style>;

// Calls fn(T{}) with T = float or double according to the dtype of `arr` (a numpy array or a dtype name).
template <typename Fn>
auto with_float_dtype(const char* op, const char* name, const py::dtype& dtype, Fn&& fn) {
  if (has_dtype<float>(dtype)) return fn(float{});
  if (has_dtype<double>(dtype)) return fn(double{});
  throw_invalid(op, name, " must have dtype float32 or float64, got ", std::string(py::str(dtype)));
}

py::dtype array_dtype(const char* op, const char* name, const py::handle& arr) {
  if (!py::isinstance<py::array>(arr)) {
    throw_invalid(op, name, " must be a numpy array, got ", std::string(py::str(py::type::of(arr))));
  }
  return py::reinterpret_borrow<py::array>(arr).dtype();
}

// Counting pass (GIL released) for the first `boundary` qualifying entries (boundary < 0: all).
template <typename T>
SparsePlan plan_sparse(const T* x, std::int64_t n, double threshold, std::int64_t boundary) {
  py::gil_scoped_release release;
  return threshold_plan(x, n, threshold, boundary);
}

// Writing pass for a plan: allocates the message with the GIL held, then writes without it.
template <typename T>
Message sparse_message(T* x, const SparsePlan& plan) {
  Message out(kHeaderWords + plan.entries);
  std::int32_t* po = out.mutable_data();
  py::gil_scoped_release release;
  threshold_encode(x, plan, po);
  return out;
}

template <typename T>
std::pair<Message, std::int64_t> bitmap_message(T* x, std::int64_t n, double threshold) {
  check_encode_args("bitmap_encode", n, threshold);
  Message out(bitmap_length(n));
  std::int32_t* po = out.mutable_data();
  py::gil_scoped_release release;
  const std::int64_t count = bitmap_encode(x, n, threshold, po);
  return {std::move(out), count};
}

const char* decode_op(std::int32_t flag) {
  return flag == kFlagSparse ? "threshold_decode" : flag == kFlagBitmap ? "bitmap_decode" : "decode";
}

// A residual's bounds argument: a writable vector of T with bounds_length(n) elements.
template <typename T>
auto checked_bounds(const char* op, const py::handle& bounds, std::int64_t n) {
  auto bd = checked_vector<T>(op, "bounds", bounds, /*writable=*/true);
  if (bd.shape(0) != bounds_length(n)) {
    throw_invalid(op, "bounds must have ", bounds_length(n), " elements (bounds_length: one per ", kBoundBlock,
                  " of the residual's ", n, " and one per ", kBoundBlock * kBoundGroup, "), got ", bd.shape(0));
  }
  return bd;
}

template <typename T>
T* device_ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

}  // namespace

void init_compress(py::module_& m) {
  m.def(
      "threshold_encode",
      [](const py::handle& residual, double threshold, std::int64_t boundary) -> Message {
        const char* op = "threshold_encode";
        return with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual, /*writable=*/true);
          T* x = r.mutable_data();
          return sparse_message(x, plan_sparse(x, r.shape(0), threshold, boundary));
        });
      },
      py::arg("residual"), py::arg("threshold"), py::arg("boundary") = -1,
      "Sparse threshold encoding of `residual` (modified in place); boundary < 0 means unlimited.");
  m.def(
      "bitmap_encode",
      [](const py::handle& residual, double threshold) -> std::pair<Message, std::int64_t> {
        const char* op = "bitmap_encode";
        return with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual, /*writable=*/true);
          return bitmap_message(r.mutable_data(), r.shape(0), threshold);
        });
      },
      py::arg("residual"), py::arg("threshold"), "Bitmap encoding of `residual` (modified in place).");
  m.def(
      "encode_smaller",
      [](const py::handle& residual, double threshold, const py::object& bounds) -> std::pair<Message, bool> {
        const char* op = "encode_smaller";
        return with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual, /*writable=*/true);
          T* x = r.mutable_data();
          const std::int64_t n = r.shape(0);
          if (bounds.is_none()) {
            const SparsePlan plan = plan_sparse(x, n, threshold, -1);
            if (sparse_is_smaller(plan.count, n)) return std::make_pair(sparse_message(x, plan), false);
            return std::make_pair(bitmap_message(x, n, threshold).first, true);
          }
          auto bd = checked_bounds<T>(op, bounds, n);
          T* pb = bd.mutable_data();
          SparsePlan plan;
          {
            py::gil_scoped_release release;
            plan = threshold_plan_bounded(x, n, threshold, -1, pb);
          }
          if (sparse_is_smaller(plan.count, n)) {
            Message message = sparse_message(x, plan);
            py::gil_scoped_release release;
            block_bounds_encoded(x, plan, pb);
            return std::make_pair(std::move(message), false);
          }
          Message message = bitmap_message(x, n, threshold).first;
          py::gil_scoped_release release;
          block_bounds(x, n, pb);
          return std::make_pair(std::move(message), true);
        });
      },
      py::arg("residual"), py::arg("threshold"), py::arg("bounds") = py::none(),
      "Encodes `residual` as whichever of sparse/bitmap is smaller; returns (message, is_bitmap). With "
      "`bounds` (residual_bounds) only the blocks whose bound reaches the threshold are read, and the "
      "bounds of the blocks encoded from are made exact.");
  m.def(
      "residual_bounds",
      [](const py::handle& residual, const py::handle& bounds, const py::object& at) {
        const char* op = "residual_bounds";
        with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual);
          const std::int64_t n = r.shape(0);
          auto bd = checked_bounds<T>(op, bounds, n);
          const T* x = r.data();
          T* pb = bd.mutable_data();
          if (at.is_none()) {
            py::gil_scoped_release release;
            block_bounds(x, n, pb);
            return;
          }
          auto idx = checked_vector<std::int64_t>(op, "at", at);
          const std::int64_t* pa = idx.data();
          py::gil_scoped_release release;
          block_bounds_at(op, x, n, pb, pa, idx.shape(0));
        });
      },
      py::arg("residual"), py::arg("bounds"), py::arg("at") = py::none(),
      "bounds[b] = max |residual| (NaN left out) over block b of BOUND_BLOCK elements, then for each group "
      "of BOUND_GROUP blocks its largest bound (bounds: (bounds_length(n),)): for every block and group, or "
      "for the blocks holding the int64 indices `at`, their groups' bounds raised to hold them.");
  m.attr("BOUND_BLOCK") = kBoundBlock;
  m.attr("BOUND_GROUP") = kBoundGroup;
  m.def(
      "bounds_length", [](std::int64_t n) {
        if (n < 0) throw_invalid("bounds_length", "n must be >= 0, got ", n);
        return bounds_length(n);
      },
      py::arg("n"), "Elements of the bounds of a residual of n elements: one per BOUND_BLOCK, then one per group.");
  m.def(
      "decode",
      [](const py::handle& message, const py::handle& target, std::int32_t flag) {
        const char* op = decode_op(flag);
        auto msg = checked_vector<std::int32_t>(op, "message", message);
        with_float_dtype(op, "target", array_dtype(op, "target", target), [&](auto tag) {
          using T = decltype(tag);
          auto z = checked_vector<T>(op, "target", target, /*writable=*/true);
          const std::int32_t* pm = msg.data();
          T* pz = z.mutable_data();
          py::gil_scoped_release release;
          decode(op, pm, msg.shape(0), pz, z.shape(0), flag);
        });
      },
      py::arg("message"), py::arg("target"), py::arg("flag"),
      "target += decoded message after validation; flag 0 sparse, 1 bitmap, -1 either.");
  m.def(
      "subtract_sparse",
      [](const py::handle& message, const py::handle& target) {
        const char* op = "subtract_message";
        auto msg = checked_vector<std::int32_t>(op, "message", message);
        with_float_dtype(op, "target", array_dtype(op, "target", target), [&](auto tag) {
          using T = decltype(tag);
          auto z = checked_vector<T>(op, "target", target, /*writable=*/true);
          const std::int32_t* pm = msg.data();
          T* pz = z.mutable_data();
          py::gil_scoped_release release;
          subtract_sparse(op, pm, msg.shape(0), pz, z.shape(0));
        });
      },
      py::arg("message"), py::arg("target"),
      "target -= decoded sparse message after validation, touching only its indices.");
  m.def(
      "pack_message",
      [](const py::handle& message) -> py::object {
        auto msg = checked_vector<std::int32_t>("pack_message", "message", message);
        const std::int32_t* pm = msg.data();
        const std::int64_t len = msg.shape(0);
        std::int64_t size;
        {
          py::gil_scoped_release release;
          size = packed_size(pm, len);
        }
        if (size < 0 || size >= 4 * len) return py::none();
        py::bytes out(nullptr, static_cast<std::size_t>(size));
        auto* po = reinterpret_cast<std::uint8_t*>(PyBytes_AsString(out.ptr()));
        py::gil_scoped_release release;
        pack_sparse(pm, len, po);
        return out;
      },
      py::arg("message"),
      "The packed wire form of a sparse message with strictly ascending entries, or None when it has "
      "none or would not be smaller.");
  m.def(
      "unpack_message",
      [](const py::buffer& packed) -> Message {
        const char* op = "unpack_message";
        const py::buffer_info info = packed.request();
        if (info.itemsize != 1 || info.ndim != 1 || (info.shape[0] > 1 && info.strides[0] != 1)) {
          throw_invalid(op, "packed must be a contiguous 1-D buffer of bytes");
        }
        const auto* pp = static_cast<const std::uint8_t*>(info.ptr);
        const std::int64_t len = info.shape[0];
        Message out(kHeaderWords + packed_entries(op, pp, len));
        std::int32_t* po = out.mutable_data();
        py::gil_scoped_release release;
        unpack_sparse(op, pp, len, po);
        return out;
      },
      py::arg("packed"), "The int32 sparse message of a packed one, every byte checked.");
  m.def(
      "accumulate",
      [](const py::handle& residual, const py::handle& update, double scale, const py::object& at) {
        const char* op = "accumulate";
        if (!std::isfinite(scale)) throw_invalid(op, "scale must be finite, got ", scale);
        with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual, /*writable=*/true);
          auto u = checked_vector<T>(op, "update", update);
          if (u.shape(0) != r.shape(0)) {
            throw_invalid(op, "update has ", u.shape(0), " elements but residual has ", r.shape(0));
          }
          T* pr = r.mutable_data();
          const T* pu = u.data();
          if (at.is_none()) {
            py::gil_scoped_release release;
            accumulate(pr, pu, r.shape(0), static_cast<T>(scale));
            return;
          }
          auto idx = checked_vector<std::int64_t>(op, "at", at);
          const std::int64_t* pa = idx.data();
          py::gil_scoped_release release;
          accumulate_at(op, pr, pu, r.shape(0), static_cast<T>(scale), pa, idx.shape(0));
        });
      },
      py::arg("residual"), py::arg("update"), py::arg("scale") = 1.0, py::arg("at") = py::none(),
      "residual += scale * update (the product rounded, then added); with `at` (int64 indices) only there.");
  m.def(
      "clip",
      [](const py::handle& residual, double limit, const py::object& bounds) {
        const char* op = "clip";
        if (!(limit >= 0)) throw_invalid(op, "limit must be >= 0, got ", limit);
        with_float_dtype(op, "residual", array_dtype(op, "residual", residual), [&](auto tag) {
          using T = decltype(tag);
          auto r = checked_vector<T>(op, "residual", residual, /*writable=*/true);
          T* pr = r.mutable_data();
          const std::int64_t n = r.shape(0);
          if (bounds.is_none()) {
            py::gil_scoped_release release;
            clip(pr, n, static_cast<T>(limit));
            return;
          }
          auto bd = checked_bounds<T>(op, bounds, n);
          T* pb = bd.mutable_data();
          py::gil_scoped_release release;
          clip_bounded(pr, n, static_cast<T>(limit), pb);
        });
      },
      py::arg("residual"), py::arg("limit"), py::arg("bounds") = py::none(),
      "residual = clip(residual, -limit, limit). With `bounds` (residual_bounds, holding) only the blocks "
      "whose bound reaches the limit are read, and their bounds become the limit.");

  // CUDA: raw device pointers; dtype is a numpy dtype. Shapes are checked by sparkgrad.compress.
  m.def(
      "cuda_threshold_encode",
      [](std::uintptr_t x, std::int64_t n, const py::dtype& dtype, double threshold, std::int64_t boundary,
         std::uintptr_t message) {
        check_encode_args("threshold_encode", n, threshold);
        with_float_dtype("threshold_encode", "residual", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          cuda::threshold_encode(device_ptr<T>(x), n, threshold, boundary < 0 ? n : boundary,
                                 device_ptr<std::int32_t>(message));
        });
      },
      py::arg("x"), py::arg("n"), py::arg("dtype"), py::arg("threshold"), py::arg("boundary"), py::arg("message"),
      "Queues the sparse encoding of the first min(count, boundary) qualifying elements (boundary < 0: all) "
      "into message: (4 + min(n, boundary),) without waiting; word 0 holds the entry count once the stream "
      "has run.");
  m.def(
      "cuda_message_entries",
      [](std::uintptr_t message) {
        py::gil_scoped_release release;
        return cuda::message_entries(device_ptr<const std::int32_t>(message));
      },
      py::arg("message"), "Word 0 of a device message once the current stream has run.");
  m.def(
      "cuda_encode_smaller",
      [](std::uintptr_t x, std::int64_t n, const py::dtype& dtype, double threshold) -> std::pair<Message, bool> {
        check_encode_args("threshold_encode", n, threshold);
        const cuda::HostMessage host = with_float_dtype("threshold_encode", "residual", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          return cuda::encode_smaller(device_ptr<T>(x), n, threshold);
        });
        Message out(host.length);
        std::memcpy(out.mutable_data(), host.words, sizeof(std::int32_t) * static_cast<std::size_t>(host.length));
        return {std::move(out), host.bitmap};
      },
      py::arg("x"), py::arg("n"), py::arg("dtype"), py::arg("threshold"),
      "encode_smaller of a device residual: (host message, is_bitmap).");
  m.def(
      "cuda_bitmap_encode",
      [](std::uintptr_t x, std::int64_t n, const py::dtype& dtype, double threshold, std::uintptr_t out) {
        check_encode_args("bitmap_encode", n, threshold);
        return with_float_dtype("bitmap_encode", "residual", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          return cuda::bitmap_encode(device_ptr<T>(x), n, threshold, device_ptr<std::int32_t>(out));
        });
      },
      py::arg("x"), py::arg("n"), py::arg("dtype"), py::arg("threshold"), py::arg("out"));
  m.def(
      "cuda_decode",
      [](std::uintptr_t msg, std::int64_t len, std::uintptr_t target, std::int64_t n, const py::dtype& dtype,
         std::int32_t flag) {
        const char* op = decode_op(flag);
        with_float_dtype(op, "target", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          cuda::decode(op, device_ptr<const std::int32_t>(msg), len, device_ptr<T>(target), n, flag);
        });
      },
      py::arg("message"), py::arg("length"), py::arg("target"), py::arg("n"), py::arg("dtype"), py::arg("flag"));
  m.def(
      "cuda_subtract_sparse",
      [](std::uintptr_t msg, std::int64_t len, std::uintptr_t target, std::int64_t n, const py::dtype& dtype) {
        const char* op = "subtract_message";
        with_float_dtype(op, "target", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          cuda::subtract_sparse(op, device_ptr<const std::int32_t>(msg), len, device_ptr<T>(target), n);
        });
      },
      py::arg("message"), py::arg("length"), py::arg("target"), py::arg("n"), py::arg("dtype"));
  m.def(
      "cuda_accumulate",
      [](std::uintptr_t residual, std::uintptr_t update, std::int64_t n, const py::dtype& dtype) {
        with_float_dtype("accumulate", "residual", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          cuda::accumulate(device_ptr<T>(residual), device_ptr<const T>(update), n);
        });
      },
      py::arg("residual"), py::arg("update"), py::arg("n"), py::arg("dtype"));
  m.def(
      "cuda_clip",
      [](std::uintptr_t residual, std::int64_t n, const py::dtype& dtype, double limit) {
        if (!(limit >= 0)) throw_invalid("clip", "limit must be >= 0, got ", limit);
        with_float_dtype("clip", "residual", dtype, [&](auto tag) {
          using T = decltype(tag);
          py::gil_scoped_release release;
          cuda::clip(device_ptr<T>(residual), n, static_cast<T>(limit));
        });
      },
      py::arg("residual"), py::arg("n"), py::arg("dtype"), py::arg("limit"));
}
