// Bindings of the neural-network kernels (cpp/include/sparkgrad/nn.h): argument checks with the GIL
// held, then the kernel with the GIL released.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_args.h"
#include "sparkgrad/nn.h"

namespace py = pybind11;
using namespace sparkgrad;
using namespace sparkgrad::bindings;

namespace {

// (N, C) or (N, C, H, W) viewed as (n, c, inner).
struct ChannelView {
  std::int64_t n, c, inner;
};
template <typename A>
ChannelView channel_view(const char* op, const char* name, const A& a) {
  require_ndim(op, name, a, {2, 4}, "(N, C) or (N, C, H, W)");
  const std::int64_t inner = a.ndim() == 4 ? a.shape(2) * a.shape(3) : 1;
  return {a.shape(0), a.shape(1), inner};
}

// Elementwise arrays viewed as (rows, cols); softmax needs a true 2-D (N, C) array.
std::pair<std::int64_t, std::int64_t> activation_view(const char* op, nn::Activation kind, const py::array& x) {
  if (kind == nn::Activation::Softmax) {
    require_ndim(op, "x", x, {2}, "2-D (N, C) for softmax");
    return {x.shape(0), x.shape(1)};
  }
  const std::int64_t rows = x.ndim() == 0 ? 1 : x.shape(0);
  return {rows, rows == 0 ? 0 : static_cast<std::int64_t>(x.size()) / rows};
}

void bias_add(const py::array& x_in, const py::array& b_in) {
  dispatch_float("bias_add", "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>("bias_add", "x", x_in, true);
    auto b = checked_array<T>("bias_add", "b", b_in);
    const ChannelView v = channel_view("bias_add", "x", x);
    require_shape("bias_add", "b", b, {v.c});
    py::gil_scoped_release release;
    nn::bias_add<T>(x.mutable_data(), b.data(), v.n, v.c, v.inner);
  });
}

void bias_grad(const py::array& dy_in, const py::array& db_in) {
  dispatch_float("bias_grad", "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>("bias_grad", "dy", dy_in);
    auto db = checked_array<T>("bias_grad", "db", db_in, true);
    const ChannelView v = channel_view("bias_grad", "dy", dy);
    require_shape("bias_grad", "db", db, {v.c});
    py::gil_scoped_release release;
    nn::bias_grad<T>(dy.data(), db.mutable_data(), v.n, v.c, v.inner);
  });
}

void activation_forward(const std::string& name, const py::array& x_in, const py::array& y_in, double alpha) {
  const char* op = "activation_forward";
  const nn::Activation kind = nn::parse_activation(op, name);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    require_shape(op, "y", y, shape_of(x));
    const auto [rows, cols] = activation_view(op, kind, x);
    py::gil_scoped_release release;
    nn::activation_forward<T>(kind, alpha, x.data(), y.mutable_data(), rows, cols);
  });
}

void activation_backward(const std::string& name, const py::array& x_in, const py::array& y_in,
                         const py::array& dy_in, const py::array& dx_in, double alpha) {
  const char* op = "activation_backward";
  const nn::Activation kind = nn::parse_activation(op, name);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    const Shape shape = shape_of(x);
    require_shape(op, "y", y, shape);
    require_shape(op, "dy", dy, shape);
    require_shape(op, "dx", dx, shape);
    const auto [rows, cols] = activation_view(op, kind, x);
    py::gil_scoped_release release;
    nn::activation_backward<T>(kind, alpha, x.data(), y.data(), dy.data(), dx.mutable_data(), rows, cols);
  });
}

// Shared by loss_score and loss_gradient: out is scores (N,) or grad (N, C).
template <bool Gradient>
void loss_call(const char* op, const std::string& loss, const std::string& activation, const py::array& labels_in,
               const py::array& preout_in, const py::array& out_in, const py::object& mask_in, double alpha) {
  const nn::LossSpec spec{nn::parse_loss(op, loss), nn::parse_activation(op, activation), alpha};
  dispatch_float(op, "preout", preout_in, [&](auto tag) {
    using T = decltype(tag);
    auto preout = checked_array<T>(op, "preout", preout_in);
    auto labels = checked_array<T>(op, "labels", labels_in);
    auto out = checked_array<T>(op, Gradient ? "grad" : "scores", out_in, true);
    require_ndim(op, "preout", preout, {2}, "2-D (N, C)");
    const std::int64_t n = preout.shape(0), c = preout.shape(1);
    require_shape(op, "labels", labels, {n, c});
    require_shape(op, Gradient ? "grad" : "scores", out, Gradient ? Shape{n, c} : Shape{n});
    py::array_t<T, py::array::c_style> mask_keep;
    const T* mask = optional_data<T>(op, "mask", mask_in, &mask_keep);
    nn::MaskLayout layout = nn::MaskLayout::None;
    if (mask) {
      const Shape ms = shape_of(mask_keep);
      if (ms == Shape{n} || ms == Shape{n, 1}) {
        layout = nn::MaskLayout::PerExample;
      } else if (ms == Shape{n, c}) {
        layout = nn::MaskLayout::PerOutput;
      } else {
        throw_invalid(op, "mask must have shape (", n, ",), (", n, ", 1) or (", n, ", ", c, "), got ",
                      shape_text(ms));
      }
    }
    py::gil_scoped_release release;
    if constexpr (Gradient) {
      nn::loss_gradient<T>(spec, labels.data(), preout.data(), mask, layout, out.mutable_data(), n, c);
    } else {
      nn::loss_score<T>(spec, labels.data(), preout.data(), mask, layout, out.mutable_data(), n, c);
    }
  });
}

void dropout_forward(const py::array& x_in, const py::array& y_in, const py::array& mask_in, double retain,
                     std::uint64_t seed) {
  const char* op = "dropout_forward";
  if (!(retain > 0.0 && retain <= 1.0)) throw_invalid(op, "retain must be in (0, 1], got ", retain);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    auto mask = checked_array<T>(op, "mask", mask_in, true);
    require_shape(op, "y", y, shape_of(x));
    require_shape(op, "mask", mask, shape_of(x));
    py::gil_scoped_release release;
    nn::dropout_forward<T>(x.data(), y.mutable_data(), mask.mutable_data(), x.size(), retain, seed);
  });
}

void dropout_backward(const py::array& dy_in, const py::array& mask_in, const py::array& dx_in) {
  const char* op = "dropout_backward";
  dispatch_float(op, "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto mask = checked_array<T>(op, "mask", mask_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    require_shape(op, "mask", mask, shape_of(dy));
    require_shape(op, "dx", dx, shape_of(dy));
    py::gil_scoped_release release;
    nn::dropout_backward<T>(dy.data(), mask.data(), dx.mutable_data(), dy.size());
  });
}

// Pooling geometry from the input (N, C, H, W) and output (N, C, P, Q) arrays; every window must overlap
// the input so that max and average are defined.
template <typename A, typename B>
nn::Pool2dShape pool_shape(const char* op, const char* x_name, const A& x, const char* y_name, const B& y,
                           std::int64_t kernel_h, std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w,
                           std::int64_t pad_top, std::int64_t pad_left) {
  require_ndim(op, x_name, x, {4}, "4-D (N, C, H, W)");
  require_ndim(op, y_name, y, {4}, "4-D (N, C, P, Q)");
  if (y.shape(0) != x.shape(0) || y.shape(1) != x.shape(1)) {
    throw_invalid(op, y_name, " must have shape (", x.shape(0), ", ", x.shape(1), ", P, Q), got ",
                  shape_text(shape_of(y)));
  }
  require_positive(op, "kernel_h", kernel_h);
  require_positive(op, "kernel_w", kernel_w);
  require_positive(op, "stride_h", stride_h);
  require_positive(op, "stride_w", stride_w);
  require_non_negative(op, "pad_top", pad_top);
  require_non_negative(op, "pad_left", pad_left);
  const nn::Pool2dShape g{x.shape(0), x.shape(1), x.shape(2), x.shape(3), y.shape(2), y.shape(3),
                          kernel_h,   kernel_w,   stride_h,   stride_w,   pad_top,    pad_left};
  const bool rows_ok = g.p == 0 || (pad_top < kernel_h && (g.p - 1) * stride_h - pad_top < g.h);
  const bool cols_ok = g.q == 0 || (pad_left < kernel_w && (g.q - 1) * stride_w - pad_left < g.w);
  if (!rows_ok || !cols_ok) {
    throw_invalid(op, "output size (", g.p, ", ", g.q, ") has pooling windows outside the (", g.h, ", ", g.w,
                  ") input for kernel (", kernel_h, ", ", kernel_w, "), stride (", stride_h, ", ", stride_w,
                  "), padding (", pad_top, ", ", pad_left, ")");
  }
  return g;
}

// The int64 argmax array: required (with `shape`) for max pooling, ignored otherwise.
std::int64_t* argmax_data(const char* op, nn::PoolKind kind, const py::object& argmax_in, const Shape& shape,
                          py::array_t<std::int64_t, py::array::c_style>* keep, bool writable) {
  if (kind != nn::PoolKind::Max) return nullptr;
  if (argmax_in.is_none()) throw_invalid(op, "argmax is required for max pooling");
  *keep = checked_array<std::int64_t>(op, "argmax", argmax_in, writable);
  require_shape(op, "argmax", *keep, shape);
  // Read-only for backward (const there); writability was checked above for forward.
  return const_cast<std::int64_t*>(keep->data());
}

void pool2d_forward(const std::string& kind_name, const py::array& x_in, const py::array& y_in, std::int64_t kernel_h,
                    std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top,
                    std::int64_t pad_left, const py::object& argmax_in) {
  const char* op = "pool2d_forward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, false);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    const nn::Pool2dShape g = pool_shape(op, "x", x, "y", y, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left);
    py::array_t<std::int64_t, py::array::c_style> keep;
    std::int64_t* argmax = argmax_data(op, kind, argmax_in, shape_of(y), &keep, true);
    py::gil_scoped_release release;
    nn::pool2d_forward<T>(kind, g, x.data(), y.mutable_data(), argmax);
  });
}

void pool2d_backward(const std::string& kind_name, const py::array& dy_in, const py::array& dx_in,
                     std::int64_t kernel_h, std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w,
                     std::int64_t pad_top, std::int64_t pad_left, const py::object& argmax_in) {
  const char* op = "pool2d_backward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, false);
  dispatch_float(op, "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    const nn::Pool2dShape g =
        pool_shape(op, "dx", dx, "dy", dy, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left);
    py::array_t<std::int64_t, py::array::c_style> keep;
    const std::int64_t* argmax = argmax_data(op, kind, argmax_in, shape_of(dy), &keep, false);
    py::gil_scoped_release release;
    nn::pool2d_backward<T>(kind, g, dy.data(), dx.mutable_data(), argmax);
  });
}

void global_pool_forward(const std::string& kind_name, const py::array& x_in, const py::array& y_in,
                         const py::object& argmax_in) {
  const char* op = "global_pool_forward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, true);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    require_ndim(op, "x", x, {4}, "4-D (N, C, H, W)");
    if (x.shape(2) * x.shape(3) == 0) throw_invalid(op, "x must have a non-empty (H, W) plane");
    require_shape(op, "y", y, {x.shape(0), x.shape(1)});
    py::array_t<std::int64_t, py::array::c_style> keep;
    std::int64_t* argmax = argmax_data(op, kind, argmax_in, shape_of(y), &keep, true);
    py::gil_scoped_release release;
    nn::global_pool_forward<T>(kind, x.data(), y.mutable_data(), argmax, x.shape(0) * x.shape(1),
                               x.shape(2) * x.shape(3));
  });
}

void global_pool_backward(const std::string& kind_name, const py::array& dy_in, const py::array& dx_in,
                          const py::object& argmax_in) {
  const char* op = "global_pool_backward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, true);
  dispatch_float(op, "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    require_ndim(op, "dx", dx, {4}, "4-D (N, C, H, W)");
    if (dx.shape(2) * dx.shape(3) == 0) throw_invalid(op, "dx must have a non-empty (H, W) plane");
    require_shape(op, "dy", dy, {dx.shape(0), dx.shape(1)});
    py::array_t<std::int64_t, py::array::c_style> keep;
    const std::int64_t* argmax = argmax_data(op, kind, argmax_in, shape_of(dy), &keep, false);
    py::gil_scoped_release release;
    nn::global_pool_backward<T>(kind, dy.data(), dx.mutable_data(), argmax, dx.shape(0) * dx.shape(1),
                                dx.shape(2) * dx.shape(3));
  });
}

// A per-channel (C,) batch-norm vector.
template <typename T>
py::array_t<T, py::array::c_style> channel_vector(const char* op, const char* name, const py::handle& arr,
                                                  std::int64_t c, bool writable = false) {
  auto v = checked_array<T>(op, name, arr, writable);
  require_shape(op, name, v, {c});
  return v;
}

void check_batchnorm_hyper(const char* op, double eps, double decay = 0.0) {
  if (!(eps >= 0.0)) throw_invalid(op, "eps must be >= 0, got ", eps);
  if (!(decay >= 0.0 && decay <= 1.0)) throw_invalid(op, "decay must be in [0, 1], got ", decay);
}

void batchnorm_forward_train(const py::array& x_in, const py::array& gamma_in, const py::array& beta_in,
                             const py::array& y_in, const py::array& mean_in, const py::array& var_in,
                             const py::array& running_mean_in, const py::array& running_var_in, double decay,
                             double eps) {
  const char* op = "batchnorm_forward_train";
  check_batchnorm_hyper(op, eps, decay);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    const ChannelView v = channel_view(op, "x", x);
    require_shape(op, "y", y, shape_of(x));
    auto gamma = channel_vector<T>(op, "gamma", gamma_in, v.c);
    auto beta = channel_vector<T>(op, "beta", beta_in, v.c);
    auto mean = channel_vector<T>(op, "batch_mean", mean_in, v.c, true);
    auto var = channel_vector<T>(op, "batch_var", var_in, v.c, true);
    auto running_mean = channel_vector<T>(op, "running_mean", running_mean_in, v.c, true);
    auto running_var = channel_vector<T>(op, "running_var", running_var_in, v.c, true);
    py::gil_scoped_release release;
    nn::batchnorm_forward_train<T>({v.n, v.c, v.inner}, x.data(), gamma.data(), beta.data(), y.mutable_data(),
                                   mean.mutable_data(), var.mutable_data(), running_mean.mutable_data(),
                                   running_var.mutable_data(), decay, eps);
  });
}

void batchnorm_forward_inference(const py::array& x_in, const py::array& gamma_in, const py::array& beta_in,
                                 const py::array& running_mean_in, const py::array& running_var_in,
                                 const py::array& y_in, double eps) {
  const char* op = "batchnorm_forward_inference";
  check_batchnorm_hyper(op, eps);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    const ChannelView v = channel_view(op, "x", x);
    require_shape(op, "y", y, shape_of(x));
    auto gamma = channel_vector<T>(op, "gamma", gamma_in, v.c);
    auto beta = channel_vector<T>(op, "beta", beta_in, v.c);
    auto running_mean = channel_vector<T>(op, "running_mean", running_mean_in, v.c);
    auto running_var = channel_vector<T>(op, "running_var", running_var_in, v.c);
    py::gil_scoped_release release;
    nn::batchnorm_forward_inference<T>({v.n, v.c, v.inner}, x.data(), gamma.data(), beta.data(), running_mean.data(),
                                       running_var.data(), y.mutable_data(), eps);
  });
}

void batchnorm_backward(const py::array& x_in, const py::array& dy_in, const py::array& gamma_in,
                        const py::array& mean_in, const py::array& var_in, const py::array& dx_in,
                        const py::array& dgamma_in, const py::array& dbeta_in, double eps) {
  const char* op = "batchnorm_backward";
  check_batchnorm_hyper(op, eps);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    const ChannelView v = channel_view(op, "x", x);
    require_shape(op, "dy", dy, shape_of(x));
    require_shape(op, "dx", dx, shape_of(x));
    auto gamma = channel_vector<T>(op, "gamma", gamma_in, v.c);
    auto mean = channel_vector<T>(op, "batch_mean", mean_in, v.c);
    auto var = channel_vector<T>(op, "batch_var", var_in, v.c);
    auto dgamma = channel_vector<T>(op, "dgamma", dgamma_in, v.c, true);
    auto dbeta = channel_vector<T>(op, "dbeta", dbeta_in, v.c, true);
    py::gil_scoped_release release;
    nn::batchnorm_backward<T>({v.n, v.c, v.inner}, x.data(), dy.data(), gamma.data(), mean.data(), var.data(),
                              dx.mutable_data(), dgamma.mutable_data(), dbeta.mutable_data(), eps);
  });
}

// Convolution geometry from x: (N, C, H, W), w: (K, C, R, S) and y: (N, K, P, Q) shapes (named for errors).
nn::Conv2dShape conv_shape(const char* op, const char* x_name, const Shape& x, const Shape& w, const char* y_name,
                           const Shape& y, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top,
                           std::int64_t pad_left) {
  if (x.size() != 4) throw_invalid(op, x_name, " must be 4-D (N, C, H, W), got shape ", shape_text(x));
  if (w.size() != 4 || w[1] != x[1]) {
    throw_invalid(op, "w must have shape (K, ", x[1], ", R, S), got ", shape_text(w));
  }
  if (w[0] < 1 || w[2] < 1 || w[3] < 1) throw_invalid(op, "w must have K, R, S >= 1, got shape ", shape_text(w));
  if (y.size() != 4 || y[0] != x[0] || y[1] != w[0]) {
    throw_invalid(op, y_name, " must have shape (", x[0], ", ", w[0], ", P, Q), got ", shape_text(y));
  }
  require_positive(op, "stride_h", stride_h);
  require_positive(op, "stride_w", stride_w);
  require_non_negative(op, "pad_top", pad_top);
  require_non_negative(op, "pad_left", pad_left);
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], stride_h, stride_w, pad_top, pad_left};
}

// The activations a convolution's forward can fuse: identity or relu (true).
bool fused_relu(const char* op, const std::string& activation) {
  const nn::Activation kind = nn::parse_activation(op, activation);
  if (kind != nn::Activation::Identity && kind != nn::Activation::Relu) {
    throw_invalid(op, "activation must be identity or relu (the fused epilogues), got '", activation, "'");
  }
  return kind == nn::Activation::Relu;
}

void conv2d_forward(const py::array& x_in, const py::array& w_in, const py::object& b_in, const py::array& y_in,
                    std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left,
                    const std::string& activation, const std::string& algorithm) {
  const char* op = "conv2d_forward";
  const bool relu = fused_relu(op, activation);
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    const nn::Conv2dShape g =
        conv_shape(op, "x", shape_of(x), shape_of(w), "y", shape_of(y), stride_h, stride_w, pad_top, pad_left);
    py::array_t<T, py::array::c_style> b_keep;
    const T* b = optional_data<T>(op, "b", b_in, &b_keep);
    if (b) require_shape(op, "b", b_keep, {g.k});
    nn::conv2d_algorithm(op, g, requested);  // a Winograd request on a shape it cannot compute: ValueError
    py::gil_scoped_release release;
    nn::conv2d_forward<T>(g, x.data(), w.data(), b, y.mutable_data(), relu, requested);
  });
}

void conv2d_backward_input(const py::array& dy_in, const py::array& w_in, const py::array& dx_in,
                           std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left,
                           const std::string& algorithm) {
  const char* op = "conv2d_backward_input";
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  dispatch_float(op, "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    const nn::Conv2dShape g =
        conv_shape(op, "dx", shape_of(dx), shape_of(w), "dy", shape_of(dy), stride_h, stride_w, pad_top, pad_left);
    nn::conv2d_algorithm(op, g, requested);
    py::gil_scoped_release release;
    nn::conv2d_backward_input<T>(g, dy.data(), w.data(), dx.mutable_data(), requested);
  });
}

void conv2d_backward_weight(const py::array& x_in, const py::array& dy_in, const py::array& dw_in,
                            std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left,
                            const std::string& algorithm) {
  const char* op = "conv2d_backward_weight";
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dw = checked_array<T>(op, "dw", dw_in, true);
    const nn::Conv2dShape g =
        conv_shape(op, "x", shape_of(x), shape_of(dw), "dy", shape_of(dy), stride_h, stride_w, pad_top, pad_left);
    nn::conv2d_algorithm(op, g, requested);
    py::gil_scoped_release release;
    nn::conv2d_backward_weight<T>(g, x.data(), dy.data(), dw.mutable_data(), requested);
  });
}

// ---- graph vertices ----------------------------------------------------------------------------------

// Same-shape arrays of one dtype from a Python list (argument `name`, at least `min_count` entries).
template <typename T>
std::vector<py::array_t<T, py::array::c_style>> checked_list(const char* op, const char* name, const py::list& in,
                                                             const Shape& shape, bool writable) {
  std::vector<py::array_t<T, py::array::c_style>> out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::string item = std::string(name) + "[" + std::to_string(i) + "]";
    out.push_back(checked_array<T>(op, item.c_str(), in[i], writable));
    require_shape(op, item.c_str(), out.back(), shape);
  }
  return out;
}

template <typename A, typename B>
bool overlaps(const A& a, const B& b) {
  const auto* a0 = reinterpret_cast<const char*>(a.data());
  const auto* b0 = reinterpret_cast<const char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void elementwise_forward(const std::string& kind_name, const py::list& inputs_in, const py::array& y_in) {
  const char* op = "elementwise_forward";
  const nn::ElementWiseOp kind = nn::parse_elementwise_op(op, kind_name);
  if (inputs_in.empty()) throw_invalid(op, "inputs must hold at least one array");
  if (kind == nn::ElementWiseOp::Subtract && inputs_in.size() != 2) {
    throw_invalid(op, "subtract needs exactly 2 inputs, got ", inputs_in.size());
  }
  dispatch_float(op, "y", y_in, [&](auto tag) {
    using T = decltype(tag);
    auto y = checked_array<T>(op, "y", y_in, true);
    const auto inputs = checked_list<T>(op, "inputs", inputs_in, shape_of(y), false);
    std::vector<const T*> ptrs;
    for (const auto& a : inputs) ptrs.push_back(a.data());
    py::gil_scoped_release release;
    nn::elementwise_forward<T>(kind, ptrs.data(), static_cast<std::int64_t>(ptrs.size()), y.mutable_data(),
                               static_cast<std::int64_t>(y.size()));
  });
}

void elementwise_backward(const std::string& kind_name, const py::list& inputs_in, const py::array& dy_in,
                          const py::list& dx_in) {
  const char* op = "elementwise_backward";
  const nn::ElementWiseOp kind = nn::parse_elementwise_op(op, kind_name);
  if (inputs_in.empty()) throw_invalid(op, "inputs must hold at least one array");
  if (kind == nn::ElementWiseOp::Subtract && inputs_in.size() != 2) {
    throw_invalid(op, "subtract needs exactly 2 inputs, got ", inputs_in.size());
  }
  if (dx_in.size() != inputs_in.size()) {
    throw_invalid(op, "dx must hold one array per input (", inputs_in.size(), "), got ", dx_in.size());
  }
  dispatch_float(op, "dy", dy_in, [&](auto tag) {
    using T = decltype(tag);
    auto dy = checked_array<T>(op, "dy", dy_in);
    const Shape shape = shape_of(dy);
    const auto inputs = checked_list<T>(op, "inputs", inputs_in, shape, false);
    auto dx = checked_list<T>(op, "dx", dx_in, shape, true);
    std::vector<const T*> in_ptrs;
    std::vector<T*> dx_ptrs;
    for (std::size_t i = 0; i < dx.size(); ++i) {
      in_ptrs.push_back(inputs[i].data());
      dx_ptrs.push_back(dx[i].mutable_data());
      bool alias = overlaps(dx[i], dy);
      for (std::size_t j = 0; j < dx.size(); ++j) {
        alias = alias || overlaps(dx[i], inputs[j]) || (j < i && overlaps(dx[i], dx[j]));
      }
      if (alias) throw_invalid(op, "dx[", i, "] must not overlap dy, an input or another dx");
    }
    py::gil_scoped_release release;
    nn::elementwise_backward<T>(kind, in_ptrs.data(), static_cast<std::int64_t>(in_ptrs.size()), dy.data(),
                                dx_ptrs.data(), static_cast<std::int64_t>(dy.size()));
  });
}

void scale_shift(const py::array& x_in, const py::array& y_in, double scale, double shift) {
  const char* op = "scale_shift";
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    require_shape(op, "y", y, shape_of(x));
    py::gil_scoped_release release;
    nn::scale_shift<T>(x.data(), y.mutable_data(), static_cast<std::int64_t>(x.size()), scale, shift);
  });
}

// (N, ...) viewed as (n, d) rows.
template <typename A>
std::pair<std::int64_t, std::int64_t> row_view(const char* op, const char* name, const A& a) {
  if (a.ndim() < 1) throw_invalid(op, name, " must have a batch axis, got a 0-d array");
  const std::int64_t n = a.shape(0);
  return {n, n == 0 ? 0 : static_cast<std::int64_t>(a.size()) / n};
}

void check_eps(const char* op, double eps) {
  if (!(eps > 0.0 && std::isfinite(eps))) throw_invalid(op, "eps must be a finite number > 0, got ", eps);
}

void l2_normalize_forward(const py::array& x_in, const py::array& y_in, const py::array& norms_in, double eps) {
  const char* op = "l2_normalize_forward";
  check_eps(op, eps);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    auto norms = checked_array<T>(op, "norms", norms_in, true);
    require_shape(op, "y", y, shape_of(x));
    const auto [n, d] = row_view(op, "x", x);
    require_shape(op, "norms", norms, {n});
    if (overlaps(x, y)) throw_invalid(op, "y must not overlap x");
    py::gil_scoped_release release;
    nn::l2_normalize_forward<T>(x.data(), y.mutable_data(), norms.mutable_data(), n, d, eps);
  });
}

void l2_normalize_backward(const py::array& y_in, const py::array& norms_in, const py::array& dy_in,
                           const py::array& dx_in, double eps) {
  const char* op = "l2_normalize_backward";
  check_eps(op, eps);
  dispatch_float(op, "y", y_in, [&](auto tag) {
    using T = decltype(tag);
    auto y = checked_array<T>(op, "y", y_in);
    auto norms = checked_array<T>(op, "norms", norms_in);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto dx = checked_array<T>(op, "dx", dx_in, true);
    const Shape shape = shape_of(y);
    require_shape(op, "dy", dy, shape);
    require_shape(op, "dx", dx, shape);
    const auto [n, d] = row_view(op, "y", y);
    require_shape(op, "norms", norms, {n});
    py::gil_scoped_release release;
    nn::l2_normalize_backward<T>(y.data(), norms.data(), dy.data(), dx.mutable_data(), n, d, eps);
  });
}

void l2_distance_forward(const py::array& a_in, const py::array& b_in, const py::array& y_in) {
  const char* op = "l2_distance_forward";
  dispatch_float(op, "a", a_in, [&](auto tag) {
    using T = decltype(tag);
    auto a = checked_array<T>(op, "a", a_in);
    auto b = checked_array<T>(op, "b", b_in);
    auto y = checked_array<T>(op, "y", y_in, true);
    require_shape(op, "b", b, shape_of(a));
    const auto [n, d] = row_view(op, "a", a);
    require_shape(op, "y", y, {n});
    py::gil_scoped_release release;
    nn::l2_distance_forward<T>(a.data(), b.data(), y.mutable_data(), n, d);
  });
}

void l2_distance_backward(const py::array& a_in, const py::array& b_in, const py::array& y_in,
                          const py::array& dy_in, const py::array& da_in, const py::array& db_in, double eps) {
  const char* op = "l2_distance_backward";
  check_eps(op, eps);
  dispatch_float(op, "a", a_in, [&](auto tag) {
    using T = decltype(tag);
    auto a = checked_array<T>(op, "a", a_in);
    auto b = checked_array<T>(op, "b", b_in);
    auto y = checked_array<T>(op, "y", y_in);
    auto dy = checked_array<T>(op, "dy", dy_in);
    auto da = checked_array<T>(op, "da", da_in, true);
    auto db = checked_array<T>(op, "db", db_in, true);
    const Shape shape = shape_of(a);
    require_shape(op, "b", b, shape);
    require_shape(op, "da", da, shape);
    require_shape(op, "db", db, shape);
    const auto [n, d] = row_view(op, "a", a);
    require_shape(op, "y", y, {n});
    require_shape(op, "dy", dy, {n});
    if (overlaps(da, db) || overlaps(da, a) || overlaps(da, b) || overlaps(db, a) || overlaps(db, b)) {
      throw_invalid(op, "da and db must not overlap each other, a or b");
    }
    py::gil_scoped_release release;
    nn::l2_distance_backward<T>(a.data(), b.data(), y.data(), dy.data(), da.mutable_data(), db.mutable_data(), n,
                                d, eps);
  });
}

// ---- LSTM ------------------------------------------------------------------------------------------
// (n, t, c, h) from x: (n, t, c) and w: (c, 4h); checks rw: (h, 4h).
template <typename A>
nn::LstmShape lstm_shape(const char* op, const A& x, const A& w, const A& rw) {
  require_ndim(op, "x", x, {3}, "3-D (N, T, C)");
  require_ndim(op, "w", w, {2}, "2-D (C, 4H)");
  const std::int64_t n = x.shape(0), t = x.shape(1), c = x.shape(2);
  require_positive(op, "x.shape[0] (examples)", n);
  require_positive(op, "x.shape[1] (time steps)", t);
  if (w.shape(0) != c || w.shape(1) % 4 != 0 || w.shape(1) == 0) {
    throw_invalid(op, "w must have shape (", c, ", 4H) with H >= 1, got ", shape_text(shape_of(w)));
  }
  const std::int64_t h = w.shape(1) / 4;
  require_shape(op, "rw", rw, {h, 4 * h});
  return {n, t, c, h};
}

// Optional (n, t) mask and (n, h) initial state arrays.
template <typename T>
struct LstmOptional {
  py::array_t<T, py::array::c_style> mask_keep, h0_keep, c0_keep;
  const T *mask = nullptr, *h0 = nullptr, *c0 = nullptr;
  LstmOptional(const char* op, const nn::LstmShape& s, const py::object& mask_in, const py::object& h0_in,
               const py::object& c0_in) {
    mask = optional_data<T>(op, "mask", mask_in, &mask_keep);
    if (mask) require_shape(op, "mask", mask_keep, {s.n, s.t});
    h0 = optional_data<T>(op, "h0", h0_in, &h0_keep);
    if (h0) require_shape(op, "h0", h0_keep, {s.n, s.h});
    c0 = optional_data<T>(op, "c0", c0_in, &c0_keep);
    if (c0) require_shape(op, "c0", c0_keep, {s.n, s.h});
  }
};

void lstm_forward(const py::array& x_in, const py::array& w_in, const py::array& rw_in, const py::array& b_in,
                  const py::array& hs_in, const py::array& cs_in, const py::array& gates_in,
                  const py::array& act_c_in, const py::object& mask_in, const py::object& h0_in,
                  const py::object& c0_in, const std::string& activation, const std::string& gate_activation,
                  double alpha, double gate_alpha) {
  const char* op = "lstm_forward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto rw = checked_array<T>(op, "rw", rw_in);
    auto b = checked_array<T>(op, "b", b_in);
    const nn::LstmShape s = lstm_shape(op, x, w, rw);
    require_shape(op, "b", b, {4 * s.h});
    auto hs = checked_array<T>(op, "hs", hs_in, true);
    auto cs = checked_array<T>(op, "cs", cs_in, true);
    auto gates = checked_array<T>(op, "gates", gates_in, true);
    auto act_c = checked_array<T>(op, "act_c", act_c_in, true);
    require_shape(op, "hs", hs, {s.n, s.t, s.h});
    require_shape(op, "cs", cs, {s.n, s.t, s.h});
    require_shape(op, "act_c", act_c, {s.n, s.t, s.h});
    require_shape(op, "gates", gates, {s.n, s.t, 4 * s.h});
    const LstmOptional<T> opt(op, s, mask_in, h0_in, c0_in);
    py::gil_scoped_release release;
    nn::lstm_forward<T>(spec, s, x.data(), w.data(), rw.data(), b.data(), opt.mask, opt.h0, opt.c0,
                        hs.mutable_data(), cs.mutable_data(), gates.mutable_data(), act_c.mutable_data());
  });
}

void lstm_backward(const py::array& x_in, const py::array& w_in, const py::array& rw_in, const py::array& hs_in,
                   const py::array& cs_in, const py::array& gates_in, const py::array& act_c_in,
                   const py::array& dh_in, const py::array& dgates_in, const py::array& dw_in,
                   const py::array& drw_in, const py::array& db_in, const py::object& dx_in,
                   const py::object& mask_in, const py::object& h0_in, const py::object& c0_in,
                   const std::string& activation, const std::string& gate_activation, double alpha,
                   double gate_alpha, std::int64_t first_step) {
  const char* op = "lstm_backward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto rw = checked_array<T>(op, "rw", rw_in);
    const nn::LstmShape s = lstm_shape(op, x, w, rw);
    if (first_step < 0 || first_step >= s.t) {
      throw_invalid(op, "first_step must be in [0, ", s.t, "), got ", first_step);
    }
    const Shape seq{s.n, s.t, s.h};
    auto hs = checked_array<T>(op, "hs", hs_in);
    auto cs = checked_array<T>(op, "cs", cs_in);
    auto act_c = checked_array<T>(op, "act_c", act_c_in);
    auto dh = checked_array<T>(op, "dh", dh_in);
    auto gates = checked_array<T>(op, "gates", gates_in);
    require_shape(op, "hs", hs, seq);
    require_shape(op, "cs", cs, seq);
    require_shape(op, "act_c", act_c, seq);
    require_shape(op, "dh", dh, seq);
    require_shape(op, "gates", gates, {s.n, s.t, 4 * s.h});
    auto dgates = checked_array<T>(op, "dgates", dgates_in, true);
    auto dw = checked_array<T>(op, "dw", dw_in, true);
    auto drw = checked_array<T>(op, "drw", drw_in, true);
    auto db = checked_array<T>(op, "db", db_in, true);
    require_shape(op, "dgates", dgates, {s.n, s.t, 4 * s.h});
    require_shape(op, "dw", dw, shape_of(w));
    require_shape(op, "drw", drw, shape_of(rw));
    require_shape(op, "db", db, {4 * s.h});
    py::array_t<T, py::array::c_style> dx;
    if (!dx_in.is_none()) {
      dx = checked_array<T>(op, "dx", dx_in, true);
      require_shape(op, "dx", dx, shape_of(x));
    }
    T* dx_data = dx_in.is_none() ? nullptr : dx.mutable_data();
    const LstmOptional<T> opt(op, s, mask_in, h0_in, c0_in);
    py::gil_scoped_release release;
    nn::lstm_backward<T>(spec, s, x.data(), w.data(), rw.data(), opt.mask, opt.h0, opt.c0, hs.data(), cs.data(),
                         gates.data(), act_c.data(), dh.data(), dgates.mutable_data(), dx_data, dw.mutable_data(),
                         drw.mutable_data(), db.mutable_data(), first_step);
  });
}

// ---- SimpleRnn -------------------------------------------------------------------------------------
// (n, t, c, h) from x: (n, t, c) and w: (c, h); checks rw: (h, h).
template <typename A>
nn::LstmShape simple_rnn_shape(const char* op, const A& x, const A& w, const A& rw) {
  require_ndim(op, "x", x, {3}, "3-D (N, T, C)");
  require_ndim(op, "w", w, {2}, "2-D (C, H)");
  const std::int64_t n = x.shape(0), t = x.shape(1), c = x.shape(2), h = w.shape(1);
  require_positive(op, "x.shape[0] (examples)", n);
  require_positive(op, "x.shape[1] (time steps)", t);
  if (w.shape(0) != c || h == 0) {
    throw_invalid(op, "w must have shape (", c, ", H) with H >= 1, got ", shape_text(shape_of(w)));
  }
  require_shape(op, "rw", rw, {h, h});
  return {n, t, c, h};
}

void simple_rnn_forward(const py::array& x_in, const py::array& w_in, const py::array& rw_in,
                        const py::array& b_in, const py::array& hs_in, const py::array& act_in,
                        const py::object& mask_in, const py::object& h0_in, const std::string& activation,
                        double alpha) {
  const char* op = "simple_rnn_forward";
  const nn::Activation kind = nn::parse_activation(op, activation);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto rw = checked_array<T>(op, "rw", rw_in);
    auto b = checked_array<T>(op, "b", b_in);
    const nn::LstmShape s = simple_rnn_shape(op, x, w, rw);
    require_shape(op, "b", b, {s.h});
    auto hs = checked_array<T>(op, "hs", hs_in, true);
    auto act = checked_array<T>(op, "act", act_in, true);
    require_shape(op, "hs", hs, {s.n, s.t, s.h});
    require_shape(op, "act", act, {s.n, s.t, s.h});
    const LstmOptional<T> opt(op, s, mask_in, h0_in, py::none());
    py::gil_scoped_release release;
    nn::simple_rnn_forward<T>(kind, alpha, s, x.data(), w.data(), rw.data(), b.data(), opt.mask, opt.h0,
                              hs.mutable_data(), act.mutable_data());
  });
}

void simple_rnn_backward(const py::array& x_in, const py::array& w_in, const py::array& rw_in,
                         const py::array& hs_in, const py::array& act_in, const py::array& dh_in,
                         const py::array& dz_in, const py::array& dw_in, const py::array& drw_in,
                         const py::array& db_in, const py::object& dx_in, const py::object& mask_in,
                         const py::object& h0_in, const std::string& activation, double alpha,
                         std::int64_t first_step) {
  const char* op = "simple_rnn_backward";
  const nn::Activation kind = nn::parse_activation(op, activation);
  dispatch_float(op, "x", x_in, [&](auto tag) {
    using T = decltype(tag);
    auto x = checked_array<T>(op, "x", x_in);
    auto w = checked_array<T>(op, "w", w_in);
    auto rw = checked_array<T>(op, "rw", rw_in);
    const nn::LstmShape s = simple_rnn_shape(op, x, w, rw);
    if (first_step < 0 || first_step >= s.t) {
      throw_invalid(op, "first_step must be in [0, ", s.t, "), got ", first_step);
    }
    const Shape seq{s.n, s.t, s.h};
    auto hs = checked_array<T>(op, "hs", hs_in);
    auto act = checked_array<T>(op, "act", act_in);
    auto dh = checked_array<T>(op, "dh", dh_in);
    require_shape(op, "hs", hs, seq);
    require_shape(op, "act", act, seq);
    require_shape(op, "dh", dh, seq);
    auto dz = checked_array<T>(op, "dz", dz_in, true);
    auto dw = checked_array<T>(op, "dw", dw_in, true);
    auto drw = checked_array<T>(op, "drw", drw_in, true);
    auto db = checked_array<T>(op, "db", db_in, true);
    require_shape(op, "dz", dz, seq);
    require_shape(op, "dw", dw, shape_of(w));
    require_shape(op, "drw", drw, shape_of(rw));
    require_shape(op, "db", db, {s.h});
    py::array_t<T, py::array::c_style> dx;
    if (!dx_in.is_none()) {
      dx = checked_array<T>(op, "dx", dx_in, true);
      require_shape(op, "dx", dx, shape_of(x));
    }
    T* dx_data = dx_in.is_none() ? nullptr : dx.mutable_data();
    const LstmOptional<T> opt(op, s, mask_in, h0_in, py::none());
    py::gil_scoped_release release;
    nn::simple_rnn_backward<T>(kind, alpha, s, x.data(), w.data(), rw.data(), opt.mask, opt.h0, hs.data(),
                               act.data(), dh.data(), dz.mutable_data(), dx_data, dw.mutable_data(),
                               drw.mutable_data(), db.mutable_data(), first_step);
  });
}

}  // namespace

void init_nn(py::module_& m) {
  m.def("bias_add", &bias_add, py::arg("x"), py::arg("b"), "x[n, c, ...] += b[c] in place; x: (N, C) or (N, C, H, W).");
  m.def("bias_grad", &bias_grad, py::arg("dy"), py::arg("db"), "db[c] = sum of dy over every axis but 1.");
  m.def("activation_forward", &activation_forward, py::arg("name"), py::arg("x"), py::arg("y"),
        py::arg("alpha") = 0.0, "y = f(x); softmax over axis 1 of a 2-D array. y may be x.");
  m.def("activation_backward", &activation_backward, py::arg("name"), py::arg("x"), py::arg("y"), py::arg("dy"),
        py::arg("dx"), py::arg("alpha") = 0.0, "dx = dL/dx from x, y = f(x) and dy = dL/dy. dx may be dy.");
  m.def(
      "loss_score",
      [](const std::string& loss, const std::string& activation, const py::array& labels, const py::array& preout,
         const py::array& scores, const py::object& mask, double alpha) {
        loss_call<false>("loss_score", loss, activation, labels, preout, scores, mask, alpha);
      },
      py::arg("loss"), py::arg("activation"), py::arg("labels"), py::arg("preout"), py::arg("scores"),
      py::arg("mask") = py::none(), py::arg("alpha") = 0.0,
      "scores (N,) = per-example loss (sum over columns) of activation(preout) against labels, times mask.");
  m.def(
      "loss_gradient",
      [](const std::string& loss, const std::string& activation, const py::array& labels, const py::array& preout,
         const py::array& grad, const py::object& mask, double alpha) {
        loss_call<true>("loss_gradient", loss, activation, labels, preout, grad, mask, alpha);
      },
      py::arg("loss"), py::arg("activation"), py::arg("labels"), py::arg("preout"), py::arg("grad"),
      py::arg("mask") = py::none(), py::arg("alpha") = 0.0,
      "grad (N, C) = d(example loss)/d(preout), times mask; not divided by N.");
  m.def("dropout_forward", &dropout_forward, py::arg("x"), py::arg("y"), py::arg("mask"), py::arg("retain"),
        py::arg("seed"), "Inverted dropout: mask = 1/retain with probability retain else 0; y = x * mask.");
  m.def("dropout_backward", &dropout_backward, py::arg("dy"), py::arg("mask"), py::arg("dx"), "dx = dy * mask.");
  const auto pool_args = [](const char* first, const char* second) {
    return std::make_tuple(py::arg("kind"), py::arg(first), py::arg(second), py::arg("kernel_h"), py::arg("kernel_w"),
                           py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
                           py::arg("argmax") = py::none());
  };
  std::apply([&](auto... a) {
    m.def("pool2d_forward", &pool2d_forward, a..., "Max / avg pooling of x (N, C, H, W) into y (N, C, P, Q).");
  }, pool_args("x", "y"));
  std::apply([&](auto... a) {
    m.def("pool2d_backward", &pool2d_backward, a..., "dx (N, C, H, W) from dy (N, C, P, Q); max needs argmax.");
  }, pool_args("dy", "dx"));
  m.def("global_pool_forward", &global_pool_forward, py::arg("kind"), py::arg("x"), py::arg("y"),
        py::arg("argmax") = py::none(), "Global max / avg / sum pooling of x (N, C, H, W) into y (N, C).");
  m.def("global_pool_backward", &global_pool_backward, py::arg("kind"), py::arg("dy"), py::arg("dx"),
        py::arg("argmax") = py::none(), "dx (N, C, H, W) from dy (N, C); max needs argmax.");
  m.def("batchnorm_forward_train", &batchnorm_forward_train, py::arg("x"), py::arg("gamma"), py::arg("beta"),
        py::arg("y"), py::arg("batch_mean"), py::arg("batch_var"), py::arg("running_mean"), py::arg("running_var"),
        py::arg("decay"), py::arg("eps"),
        "Normalizes x with its per-channel batch statistics; updates the running averages in place.");
  m.def("batchnorm_forward_inference", &batchnorm_forward_inference, py::arg("x"), py::arg("gamma"),
        py::arg("beta"), py::arg("running_mean"), py::arg("running_var"), py::arg("y"), py::arg("eps"),
        "Normalizes x with the running statistics.");
  m.def("batchnorm_backward", &batchnorm_backward, py::arg("x"), py::arg("dy"), py::arg("gamma"),
        py::arg("batch_mean"), py::arg("batch_var"), py::arg("dx"), py::arg("dgamma"), py::arg("dbeta"),
        py::arg("eps"), "dx, dgamma, dbeta of the training-mode forward.");
  m.def("conv2d_forward", &conv2d_forward, py::arg("x"), py::arg("w"), py::arg("b"), py::arg("y"), py::arg("stride_h"),
        py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"), py::arg("activation") = "identity",
        py::arg("algorithm") = "auto",
        "y (N, K, P, Q) = activation(conv(x (N, C, H, W), w (K, C, R, S)) + b); padding reads zeros. activation: "
        "identity or relu (fused). algorithm: auto (per shape), im2col or winograd (3x3, stride 1, padding <= 2).");
  m.def("conv2d_backward_input", &conv2d_backward_input, py::arg("dy"), py::arg("w"), py::arg("dx"),
        py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
        py::arg("algorithm") = "auto", "dx (N, C, H, W) from dy (N, K, P, Q) and w (K, C, R, S).");
  m.def("conv2d_backward_weight", &conv2d_backward_weight, py::arg("x"), py::arg("dy"), py::arg("dw"),
        py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
        py::arg("algorithm") = "auto",
        "dw (K, C, R, S) from x (N, C, H, W) and dy (N, K, P, Q), summed over the batch.");
  m.def("lstm_forward", &lstm_forward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("b"), py::arg("hs"),
        py::arg("cs"), py::arg("gates"), py::arg("act_c"), py::arg("mask") = py::none(), py::arg("h0") = py::none(),
        py::arg("c0") = py::none(), py::arg("activation") = "tanh", py::arg("gate_activation") = "sigmoid",
        py::arg("alpha") = 0.0, py::arg("gate_alpha") = 0.0,
        "LSTM over x (N, T, C) with w (C, 4H), rw (H, 4H), b (4H), gate order [a, f, o, i] (DL4J): writes hs, cs, "
        "act_c (N, T, H) and the activated gates (N, T, 4H). mask (N, T) multiplies h and c per step.");
  m.def("lstm_backward", &lstm_backward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("hs"), py::arg("cs"),
        py::arg("gates"), py::arg("act_c"), py::arg("dh"), py::arg("dgates"), py::arg("dw"), py::arg("drw"),
        py::arg("db"), py::arg("dx") = py::none(), py::arg("mask") = py::none(), py::arg("h0") = py::none(),
        py::arg("c0") = py::none(), py::arg("activation") = "tanh", py::arg("gate_activation") = "sigmoid",
        py::arg("alpha") = 0.0, py::arg("gate_alpha") = 0.0, py::arg("first_step") = 0,
        "Backward of lstm_forward given dh = dL/dhs (N, T, H): writes dgates, dw, drw, db and dx (if given); "
        "steps before first_step get no gradient (truncated BPTT).");
  m.def("simple_rnn_forward", &simple_rnn_forward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("b"),
        py::arg("hs"), py::arg("act"), py::arg("mask") = py::none(), py::arg("h0") = py::none(),
        py::arg("activation") = "tanh", py::arg("alpha") = 0.0,
        "SimpleRnn over x (N, T, C) with w (C, H), rw (H, H), b (H): writes the outputs hs and act = the "
        "activations before the mask, both (N, T, H). mask (N, T) multiplies each step's output.");
  m.def("simple_rnn_backward", &simple_rnn_backward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("hs"),
        py::arg("act"), py::arg("dh"), py::arg("dz"), py::arg("dw"), py::arg("drw"), py::arg("db"),
        py::arg("dx") = py::none(), py::arg("mask") = py::none(), py::arg("h0") = py::none(),
        py::arg("activation") = "tanh", py::arg("alpha") = 0.0, py::arg("first_step") = 0,
        "Backward of simple_rnn_forward given dh = dL/dhs (N, T, H): writes dz = dL/d(pre-activations), dw, drw, "
        "db and dx (if given); steps before first_step get no gradient (truncated BPTT).");
  m.def("elementwise_forward", &elementwise_forward, py::arg("kind"), py::arg("inputs"), py::arg("y"),
        "y = add / subtract / product / average / max of the same-shape arrays in inputs (subtract: 2).");
  m.def("elementwise_backward", &elementwise_backward, py::arg("kind"), py::arg("inputs"), py::arg("dy"),
        py::arg("dx"), "dx[i] = dL/d inputs[i] from dy; max routes dy to the first maximal input.");
  m.def("scale_shift", &scale_shift, py::arg("x"), py::arg("y"), py::arg("scale") = 1.0, py::arg("shift") = 0.0,
        "y = x * scale + shift; y may be x.");
  m.def("l2_normalize_forward", &l2_normalize_forward, py::arg("x"), py::arg("y"), py::arg("norms"),
        py::arg("eps"), "y = x / max(||x_i||, eps) per example (row of the (N, ...) array); norms (N,).");
  m.def("l2_normalize_backward", &l2_normalize_backward, py::arg("y"), py::arg("norms"), py::arg("dy"),
        py::arg("dx"), py::arg("eps"), "dx from y, norms and dy of l2_normalize_forward; dx may be dy.");
  m.def("l2_distance_forward", &l2_distance_forward, py::arg("a"), py::arg("b"), py::arg("y"),
        "y (N,) = ||a_i - b_i||_2 per example of the (N, ...) arrays a and b.");
  m.def("l2_distance_backward", &l2_distance_backward, py::arg("a"), py::arg("b"), py::arg("y"), py::arg("dy"),
        py::arg("da"), py::arg("db"), py::arg("eps"), "da = dy (a - b) / max(y, eps), db = -da.");
}
