// Bindings of the neural-network kernels (cpp/include/sparkgrad/nn.h): the one front door of each kernel
// for host and device arrays alike. Its arguments are checked once with the GIL held (ArrayView:
// dtype, C order, shape, writability, one device), then the CPU twin nn::f or the CUDA twin
// nn::cuda::f runs with the GIL released.
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
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
ChannelView channel_view(const ArrayView& a) {
  a.require_ndim({2, 4}, "(N, C) or (N, C, H, W)");
  const std::int64_t inner = a.ndim() == 4 ? a.shape(2) * a.shape(3) : 1;
  return {a.shape(0), a.shape(1), inner};
}

// Elementwise arrays viewed as (rows, cols); softmax needs a true 2-D (N, C) array.
std::pair<std::int64_t, std::int64_t> activation_view(nn::Activation kind, const ArrayView& x) {
  if (kind == nn::Activation::Softmax) {
    x.require_ndim({2}, "2-D (N, C) for softmax");
    return {x.shape(0), x.shape(1)};
  }
  const std::int64_t rows = x.ndim() == 0 ? 1 : x.shape(0);
  return {rows, rows == 0 ? 0 : x.size() / rows};
}

void bias_add(py::handle x_in, py::handle b_in) {
  const char* op = "bias_add";
  const ArrayView x(op, "x", x_in), b(op, "b", b_in);
  const Place place = common_place(op, {&x, &b});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>(true);
    b.require<T>();
    const ChannelView v = channel_view(x);
    b.require_shape({v.c});
    SPARKGRAD_RUN_TWIN(place, nn, bias_add<T>, x.mutable_data<T>(), b.data<T>(), v.n, v.c, v.inner);
  });
}

void bias_grad(py::handle dy_in, py::handle db_in) {
  const char* op = "bias_grad";
  const ArrayView dy(op, "dy", dy_in), db(op, "db", db_in);
  const Place place = common_place(op, {&dy, &db});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    db.require<T>(true);
    const ChannelView v = channel_view(dy);
    db.require_shape({v.c});
    SPARKGRAD_RUN_TWIN(place, nn, bias_grad<T>, dy.data<T>(), db.mutable_data<T>(), v.n, v.c, v.inner);
  });
}

void swap_last_axes(py::handle x_in, py::handle y_in) {
  const char* op = "swap_last_axes";
  const ArrayView x(op, "x", x_in), y(op, "y", y_in);
  const Place place = common_place(op, {&x, &y});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    x.require_ndim({3}, "(N, rows, cols)");
    y.require_shape({x.shape(0), x.shape(2), x.shape(1)});
    if (x.data<T>() == y.data<T>() && x.size() > 0) throw_invalid(op, "y must not be x");
    SPARKGRAD_RUN_TWIN(place, nn, swap_last_axes<T>, x.data<T>(), y.mutable_data<T>(), x.shape(0), x.shape(1),
                       x.shape(2));
  });
}

void activation_forward(const std::string& name, py::handle x_in, py::handle y_in, double alpha) {
  const char* op = "activation_forward";
  const nn::Activation kind = nn::parse_activation(op, name);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in);
  const Place place = common_place(op, {&x, &y});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    y.require_shape(x.shape());
    const auto [rows, cols] = activation_view(kind, x);
    SPARKGRAD_RUN_TWIN(place, nn, activation_forward<T>, kind, alpha, x.data<T>(), y.mutable_data<T>(), rows, cols);
  });
}

void activation_backward(const std::string& name, py::handle x_in, py::handle y_in, py::handle dy_in,
                         py::handle dx_in, double alpha) {
  const char* op = "activation_backward";
  const nn::Activation kind = nn::parse_activation(op, name);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), dy(op, "dy", dy_in), dx(op, "dx", dx_in);
  const Place place = common_place(op, {&x, &y, &dy, &dx});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>();
    dy.require<T>();
    dx.require<T>(true);
    y.require_shape(x.shape());
    dy.require_shape(x.shape());
    dx.require_shape(x.shape());
    const auto [rows, cols] = activation_view(kind, x);
    SPARKGRAD_RUN_TWIN(place, nn, activation_backward<T>, kind, alpha, x.data<T>(), y.data<T>(), dy.data<T>(),
                       dx.mutable_data<T>(), rows, cols);
  });
}

// Shared by loss_score and loss_gradient: out is scores (N,) or grad (N, C).
template <bool Gradient>
void loss_call(const char* op, const std::string& loss, const std::string& activation, py::handle labels_in,
               py::handle preout_in, py::handle out_in, py::handle mask_in, double alpha) {
  const nn::LossSpec spec{nn::parse_loss(op, loss), nn::parse_activation(op, activation), alpha};
  const ArrayView preout(op, "preout", preout_in), labels(op, "labels", labels_in);
  const ArrayView out(op, Gradient ? "grad" : "scores", out_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in);
  const Place place = common_place(op, {&preout, &labels, &out, &mask});
  dispatch_float(op, preout, [&](auto tag) {
    using T = decltype(tag);
    preout.require<T>();
    labels.require<T>();
    out.require<T>(true);
    preout.require_ndim({2}, "2-D (N, C)");
    const std::int64_t n = preout.shape(0), c = preout.shape(1);
    labels.require_shape({n, c});
    out.require_shape(Gradient ? Shape{n, c} : Shape{n});
    mask.require<T>();
    nn::MaskLayout layout = nn::MaskLayout::None;
    if (mask.present()) {
      if (mask.shape() == Shape{n} || mask.shape() == Shape{n, 1}) {
        layout = nn::MaskLayout::PerExample;
      } else if (mask.shape() == Shape{n, c}) {
        layout = nn::MaskLayout::PerOutput;
      } else {
        throw_invalid(op, "mask must have shape (", n, ",), (", n, ", 1) or (", n, ", ", c, "), got ",
                      shape_text(mask.shape()));
      }
    }
    if constexpr (Gradient) {
      SPARKGRAD_RUN_TWIN(place, nn, loss_gradient<T>, spec, labels.data<T>(), preout.data<T>(), mask.data<T>(),
                         layout, out.mutable_data<T>(), n, c);
    } else {
      SPARKGRAD_RUN_TWIN(place, nn, loss_score<T>, spec, labels.data<T>(), preout.data<T>(), mask.data<T>(), layout,
                         out.mutable_data<T>(), n, c);
    }
  });
}

void dropout_forward(py::handle x_in, py::handle y_in, py::handle mask_in, double retain, std::uint64_t seed) {
  const char* op = "dropout_forward";
  if (!(retain > 0.0 && retain <= 1.0)) throw_invalid(op, "retain must be in (0, 1], got ", retain);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), mask(op, "mask", mask_in);
  const Place place = common_place(op, {&x, &y, &mask});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    mask.require<T>(true);
    y.require_shape(x.shape());
    mask.require_shape(x.shape());
    SPARKGRAD_RUN_TWIN(place, nn, dropout_forward<T>, x.data<T>(), y.mutable_data<T>(), mask.mutable_data<T>(),
                       x.size(), retain, seed);
  });
}

void dropout_backward(py::handle dy_in, py::handle mask_in, py::handle dx_in) {
  const char* op = "dropout_backward";
  const ArrayView dy(op, "dy", dy_in), mask(op, "mask", mask_in), dx(op, "dx", dx_in);
  const Place place = common_place(op, {&dy, &mask, &dx});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    mask.require<T>();
    dx.require<T>(true);
    mask.require_shape(dy.shape());
    dx.require_shape(dy.shape());
    SPARKGRAD_RUN_TWIN(place, nn, dropout_backward<T>, dy.data<T>(), mask.data<T>(), dx.mutable_data<T>(),
                       dy.size());
  });
}

// indices (n) int64 into the rows of w (vocab, dim); rows (n, dim) is y (forward) or dy (backward). The
// twins check every index; an out-of-range one is a ValueError naming its position and value.
template <bool Backward>
void embedding_call(const char* op, py::handle indices_in, py::handle w_in, py::handle rows_in) {
  const ArrayView indices(op, "indices", indices_in), w(op, Backward ? "dw" : "w", w_in),
      rows(op, Backward ? "dy" : "y", rows_in);
  const Place place = common_place(op, {&indices, &w, &rows});
  indices.require<std::int64_t>();
  indices.require_ndim({1}, "1-D (n)");
  w.require_ndim({2}, "2-D (vocab, dim)");
  dispatch_float(op, w, [&](auto tag) {
    using T = decltype(tag);
    w.require<T>(Backward);
    rows.require<T>(!Backward);
    rows.require_shape({indices.shape(0), w.shape(1)});
    std::int64_t bad[2] = {-1, 0};
    const std::int64_t n = indices.shape(0), vocab = w.shape(0), dim = w.shape(1);
    if constexpr (Backward) {
      SPARKGRAD_RUN_TWIN(place, nn, embedding_backward<T>, indices.data<std::int64_t>(), rows.data<T>(),
                         w.mutable_data<T>(), n, vocab, dim, bad);
    } else {
      SPARKGRAD_RUN_TWIN(place, nn, embedding_forward<T>, indices.data<std::int64_t>(), w.data<T>(),
                         rows.mutable_data<T>(), n, vocab, dim, bad);
    }
    if (bad[0] >= 0) throw_invalid(op, "index ", bad[1], " at position ", bad[0], " is outside [0, ", vocab, ")");
  });
}

// Pooling geometry from the input (N, C, H, W) and output (N, C, P, Q) arrays; every window must overlap
// the input so that max and average are defined.
nn::Pool2dShape pool_shape(const char* op, const ArrayView& x, const ArrayView& y, std::int64_t kernel_h,
                           std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top,
                           std::int64_t pad_left) {
  x.require_ndim({4}, "4-D (N, C, H, W)");
  y.require_ndim({4}, "4-D (N, C, P, Q)");
  if (y.shape(0) != x.shape(0) || y.shape(1) != x.shape(1)) {
    throw_invalid(op, y.name(), " must have shape (", x.shape(0), ", ", x.shape(1), ", P, Q), got ",
                  shape_text(y.shape()));
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

// The int64 argmax array of max pooling (absent otherwise: other kinds ignore the argument).
ArrayView argmax_view(const char* op, nn::PoolKind kind, py::handle argmax_in) {
  if (kind == nn::PoolKind::Max && argmax_in.is_none()) throw_invalid(op, "argmax is required for max pooling");
  return ArrayView::optional(op, "argmax", kind == nn::PoolKind::Max ? argmax_in : py::none());
}

void pool2d_forward(const std::string& kind_name, py::handle x_in, py::handle y_in, std::int64_t kernel_h,
                    std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top,
                    std::int64_t pad_left, py::handle argmax_in) {
  const char* op = "pool2d_forward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, false);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), argmax = argmax_view(op, kind, argmax_in);
  const Place place = common_place(op, {&x, &y, &argmax});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    const nn::Pool2dShape g = pool_shape(op, x, y, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left);
    argmax.require<std::int64_t>(true);
    argmax.require_shape(y.shape());
    SPARKGRAD_RUN_TWIN(place, nn, pool2d_forward<T>, kind, g, x.data<T>(), y.mutable_data<T>(),
                       argmax.mutable_data<std::int64_t>());
  });
}

void pool2d_backward(const std::string& kind_name, py::handle dy_in, py::handle dx_in, std::int64_t kernel_h,
                     std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top,
                     std::int64_t pad_left, py::handle argmax_in) {
  const char* op = "pool2d_backward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, false);
  const ArrayView dy(op, "dy", dy_in), dx(op, "dx", dx_in), argmax = argmax_view(op, kind, argmax_in);
  const Place place = common_place(op, {&dy, &dx, &argmax});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    dx.require<T>(true);
    const nn::Pool2dShape g = pool_shape(op, dx, dy, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left);
    argmax.require<std::int64_t>();
    argmax.require_shape(dy.shape());
    SPARKGRAD_RUN_TWIN(place, nn, pool2d_backward<T>, kind, g, dy.data<T>(), dx.mutable_data<T>(),
                       argmax.data<std::int64_t>());
  });
}

void global_pool_forward(const std::string& kind_name, py::handle x_in, py::handle y_in, py::handle argmax_in) {
  const char* op = "global_pool_forward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, true);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), argmax = argmax_view(op, kind, argmax_in);
  const Place place = common_place(op, {&x, &y, &argmax});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    x.require_ndim({4}, "4-D (N, C, H, W)");
    if (x.shape(2) * x.shape(3) == 0) throw_invalid(op, "x must have a non-empty (H, W) plane");
    y.require_shape({x.shape(0), x.shape(1)});
    argmax.require<std::int64_t>(true);
    argmax.require_shape(y.shape());
    SPARKGRAD_RUN_TWIN(place, nn, global_pool_forward<T>, kind, x.data<T>(), y.mutable_data<T>(),
                       argmax.mutable_data<std::int64_t>(), x.shape(0) * x.shape(1), x.shape(2) * x.shape(3));
  });
}

void global_pool_backward(const std::string& kind_name, py::handle dy_in, py::handle dx_in, py::handle argmax_in) {
  const char* op = "global_pool_backward";
  const nn::PoolKind kind = nn::parse_pool_kind(op, kind_name, true);
  const ArrayView dy(op, "dy", dy_in), dx(op, "dx", dx_in), argmax = argmax_view(op, kind, argmax_in);
  const Place place = common_place(op, {&dy, &dx, &argmax});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    dx.require<T>(true);
    dx.require_ndim({4}, "4-D (N, C, H, W)");
    if (dx.shape(2) * dx.shape(3) == 0) throw_invalid(op, "dx must have a non-empty (H, W) plane");
    dy.require_shape({dx.shape(0), dx.shape(1)});
    argmax.require<std::int64_t>();
    argmax.require_shape(dy.shape());
    SPARKGRAD_RUN_TWIN(place, nn, global_pool_backward<T>, kind, dy.data<T>(), dx.mutable_data<T>(),
                       argmax.data<std::int64_t>(), dx.shape(0) * dx.shape(1), dx.shape(2) * dx.shape(3));
  });
}

// Per-channel (C,) batch-norm vectors.
template <typename T>
void require_channel_vectors(std::int64_t c, std::initializer_list<std::pair<const ArrayView*, bool>> vectors) {
  for (const auto& [v, writable] : vectors) {
    v->template require<T>(writable);
    v->require_shape({c});
  }
}

void check_batchnorm_hyper(const char* op, double eps, double decay = 0.0) {
  if (!(eps >= 0.0)) throw_invalid(op, "eps must be >= 0, got ", eps);
  if (!(decay >= 0.0 && decay <= 1.0)) throw_invalid(op, "decay must be in [0, 1], got ", decay);
}

void batchnorm_forward_train(py::handle x_in, py::handle gamma_in, py::handle beta_in, py::handle y_in,
                             py::handle mean_in, py::handle var_in, py::handle running_mean_in,
                             py::handle running_var_in, double decay, double eps) {
  const char* op = "batchnorm_forward_train";
  check_batchnorm_hyper(op, eps, decay);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), gamma(op, "gamma", gamma_in), beta(op, "beta", beta_in);
  const ArrayView mean(op, "batch_mean", mean_in), var(op, "batch_var", var_in);
  const ArrayView running_mean(op, "running_mean", running_mean_in), running_var(op, "running_var", running_var_in);
  const Place place = common_place(op, {&x, &y, &gamma, &beta, &mean, &var, &running_mean, &running_var});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    const ChannelView v = channel_view(x);
    y.require_shape(x.shape());
    require_channel_vectors<T>(v.c, {{&gamma, false}, {&beta, false}, {&mean, true}, {&var, true},
                                     {&running_mean, true}, {&running_var, true}});
    SPARKGRAD_RUN_TWIN(place, nn, batchnorm_forward_train<T>, {v.n, v.c, v.inner}, x.data<T>(), gamma.data<T>(),
                       beta.data<T>(), y.mutable_data<T>(), mean.mutable_data<T>(), var.mutable_data<T>(),
                       running_mean.mutable_data<T>(), running_var.mutable_data<T>(), decay, eps);
  });
}

void batchnorm_forward_inference(py::handle x_in, py::handle gamma_in, py::handle beta_in, py::handle running_mean_in,
                                 py::handle running_var_in, py::handle y_in, double eps) {
  const char* op = "batchnorm_forward_inference";
  check_batchnorm_hyper(op, eps);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), gamma(op, "gamma", gamma_in), beta(op, "beta", beta_in);
  const ArrayView running_mean(op, "running_mean", running_mean_in), running_var(op, "running_var", running_var_in);
  const Place place = common_place(op, {&x, &y, &gamma, &beta, &running_mean, &running_var});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    const ChannelView v = channel_view(x);
    y.require_shape(x.shape());
    require_channel_vectors<T>(v.c, {{&gamma, false}, {&beta, false}, {&running_mean, false}, {&running_var, false}});
    SPARKGRAD_RUN_TWIN(place, nn, batchnorm_forward_inference<T>, {v.n, v.c, v.inner}, x.data<T>(), gamma.data<T>(),
                       beta.data<T>(), running_mean.data<T>(), running_var.data<T>(), y.mutable_data<T>(), eps);
  });
}

void batchnorm_backward(py::handle x_in, py::handle dy_in, py::handle gamma_in, py::handle mean_in, py::handle var_in,
                        py::handle dx_in, py::handle dgamma_in, py::handle dbeta_in, double eps) {
  const char* op = "batchnorm_backward";
  check_batchnorm_hyper(op, eps);
  const ArrayView x(op, "x", x_in), dy(op, "dy", dy_in), dx(op, "dx", dx_in), gamma(op, "gamma", gamma_in);
  const ArrayView mean(op, "batch_mean", mean_in), var(op, "batch_var", var_in);
  const ArrayView dgamma(op, "dgamma", dgamma_in), dbeta(op, "dbeta", dbeta_in);
  const Place place = common_place(op, {&x, &dy, &dx, &gamma, &mean, &var, &dgamma, &dbeta});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    dy.require<T>();
    dx.require<T>(true);
    const ChannelView v = channel_view(x);
    dy.require_shape(x.shape());
    dx.require_shape(x.shape());
    require_channel_vectors<T>(v.c, {{&gamma, false}, {&mean, false}, {&var, false}, {&dgamma, true}, {&dbeta, true}});
    SPARKGRAD_RUN_TWIN(place, nn, batchnorm_backward<T>, {v.n, v.c, v.inner}, x.data<T>(), dy.data<T>(),
                       gamma.data<T>(), mean.data<T>(), var.data<T>(), dx.mutable_data<T>(), dgamma.mutable_data<T>(),
                       dbeta.mutable_data<T>(), eps);
  });
}

// Convolution geometry from x: (N, C, H, W), w: (K, C, R, S) and y: (N, K, P, Q) (named by their views).
nn::Conv2dShape conv_shape(const char* op, const ArrayView& x, const ArrayView& w, const ArrayView& y,
                           std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left) {
  x.require_ndim({4}, "4-D (N, C, H, W)");
  if (w.ndim() != 4 || w.shape(1) != x.shape(1)) {
    throw_invalid(op, w.name(), " must have shape (K, ", x.shape(1), ", R, S), got ", shape_text(w.shape()));
  }
  if (w.shape(0) < 1 || w.shape(2) < 1 || w.shape(3) < 1) {
    throw_invalid(op, w.name(), " must have K, R, S >= 1, got shape ", shape_text(w.shape()));
  }
  if (y.ndim() != 4 || y.shape(0) != x.shape(0) || y.shape(1) != w.shape(0)) {
    throw_invalid(op, y.name(), " must have shape (", x.shape(0), ", ", w.shape(0), ", P, Q), got ",
                  shape_text(y.shape()));
  }
  require_positive(op, "stride_h", stride_h);
  require_positive(op, "stride_w", stride_w);
  require_non_negative(op, "pad_top", pad_top);
  require_non_negative(op, "pad_left", pad_left);
  return {x.shape(0), x.shape(1), x.shape(2), x.shape(3), w.shape(0), w.shape(2), w.shape(3), y.shape(2), y.shape(3),
          stride_h,   stride_w,   pad_top,    pad_left};
}

// A ValueError, before any kernel runs, for an algorithm `place` lacks (Winograd on a GPU, cuDNN on the CPU,
// Winograd or cuDNN on a shape it cannot compute). The twins take the request itself: the GPU's auto
// measures its choice on the first call of each shape (cuda/nn/conv2d.cu).
void check_conv_algorithm(const char* op, const Place& place, const nn::Conv2dShape& g, nn::ConvAlgorithm requested) {
  if (place.gpu) {
    nn::cuda::conv2d_algorithm(op, g, requested);
  } else {
    nn::conv2d_algorithm(op, g, requested);
  }
}

// The activations a convolution's forward can fuse: identity or relu (true).
bool fused_relu(const char* op, const std::string& activation) {
  const nn::Activation kind = nn::parse_activation(op, activation);
  if (kind != nn::Activation::Identity && kind != nn::Activation::Relu) {
    throw_invalid(op, "activation must be identity or relu (the fused epilogues), got '", activation, "'");
  }
  return kind == nn::Activation::Relu;
}

void conv2d_forward(py::handle x_in, py::handle w_in, py::handle b_in, py::handle y_in, std::int64_t stride_h,
                    std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left, const std::string& activation,
                    const std::string& algorithm) {
  const char* op = "conv2d_forward";
  const bool relu = fused_relu(op, activation);
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), y(op, "y", y_in), b = ArrayView::optional(op, "b", b_in);
  const Place place = common_place(op, {&x, &w, &y, &b});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    y.require<T>(true);
    const nn::Conv2dShape g = conv_shape(op, x, w, y, stride_h, stride_w, pad_top, pad_left);
    b.require<T>();
    b.require_shape({g.k});
    check_conv_algorithm(op, place, g, requested);
    SPARKGRAD_RUN_TWIN(place, nn, conv2d_forward<T>, g, x.data<T>(), w.data<T>(), b.data<T>(), y.mutable_data<T>(),
                       relu, requested);
  });
}

void conv2d_backward_input(py::handle dy_in, py::handle w_in, py::handle dx_in, std::int64_t stride_h,
                           std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left,
                           const std::string& algorithm, py::handle b_in, const std::string& activation) {
  const char* op = "conv2d_backward_input";
  const bool relu = fused_relu(op, activation);
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  const ArrayView dy(op, "dy", dy_in), w(op, "w", w_in), dx(op, "dx", dx_in), b = ArrayView::optional(op, "b", b_in);
  const Place place = common_place(op, {&dy, &w, &dx, &b});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    w.require<T>();
    dx.require<T>(true);
    const nn::Conv2dShape g = conv_shape(op, dx, w, dy, stride_h, stride_w, pad_top, pad_left);
    b.require<T>();
    b.require_shape({g.c});
    check_conv_algorithm(op, place, g, requested);
    SPARKGRAD_RUN_TWIN(place, nn, conv2d_backward_input<T>, g, dy.data<T>(), w.data<T>(), b.data<T>(),
                       dx.mutable_data<T>(), relu, requested);
  });
}

void conv2d_backward_weight(py::handle x_in, py::handle dy_in, py::handle dw_in, std::int64_t stride_h,
                            std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left,
                            const std::string& algorithm) {
  const char* op = "conv2d_backward_weight";
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  const ArrayView x(op, "x", x_in), dy(op, "dy", dy_in), dw(op, "dw", dw_in);
  const Place place = common_place(op, {&x, &dy, &dw});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    dy.require<T>();
    dw.require<T>(true);
    const nn::Conv2dShape g = conv_shape(op, x, dw, dy, stride_h, stride_w, pad_top, pad_left);
    check_conv_algorithm(op, place, g, requested);
    SPARKGRAD_RUN_TWIN(place, nn, conv2d_backward_weight<T>, g, x.data<T>(), dy.data<T>(), dw.mutable_data<T>(),
                       requested);
  });
}

// Optional y: dw only. The weights' shape gives (K, C, R, S) as for conv2d_backward_weight's dw.
void conv2d_forward_backward_weight(py::handle x_in, py::handle w_in, py::handle dy_in, py::handle y_in,
                                    py::handle dw_in, std::int64_t stride_h, std::int64_t stride_w,
                                    std::int64_t pad_top, std::int64_t pad_left, const std::string& algorithm) {
  const char* op = "conv2d_forward_backward_weight";
  const nn::ConvAlgorithm requested = nn::parse_conv_algorithm(op, algorithm);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), dy(op, "dy", dy_in), dw(op, "dw", dw_in),
      y = ArrayView::optional(op, "y", y_in);
  const Place place = common_place(op, {&x, &w, &dy, &dw, &y});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    dy.require<T>();
    dw.require<T>(true);
    y.require<T>(true);
    const nn::Conv2dShape g = conv_shape(op, x, w, dy, stride_h, stride_w, pad_top, pad_left);
    dw.require_shape(w.shape());
    y.require_shape(dy.shape());
    check_conv_algorithm(op, place, g, requested);
    SPARKGRAD_RUN_TWIN(place, nn, conv2d_forward_backward_weight<T>, g, x.data<T>(), w.data<T>(), dy.data<T>(),
                       y.mutable_data<T>(), dw.mutable_data<T>(), requested);
  });
}

// ---- graph vertices ----------------------------------------------------------------------------------

// The arrays of a list argument (`name`: a list or tuple), each named name[i].
std::vector<ArrayView> array_list(const char* op, const char* name, py::handle list) {
  if (!py::isinstance<py::list>(list) && !py::isinstance<py::tuple>(list)) {
    throw py::type_error(op_message(op, name, " must be a list of arrays, got ",
                                    std::string(py::str(py::type::of(list).attr("__name__")))));
  }
  std::vector<ArrayView> out;
  std::size_t i = 0;
  for (py::handle item : list) out.emplace_back(op, std::string(name) + "[" + std::to_string(i++) + "]", item);
  return out;
}

// The element-wise op of a vertex with k inputs (k >= 1; subtract takes exactly 2).
nn::ElementWiseOp elementwise_op(const char* op, const std::string& name, std::size_t k) {
  const nn::ElementWiseOp kind = nn::parse_elementwise_op(op, name);
  if (k == 0) throw_invalid(op, "inputs must hold at least one array");
  if (kind == nn::ElementWiseOp::Subtract && k != 2) throw_invalid(op, "subtract needs exactly 2 inputs, got ", k);
  return kind;
}

// The place shared by `first` and every view of `lists`.
Place common_place_with(const char* op, const ArrayView& first, std::initializer_list<const std::vector<ArrayView>*> lists) {
  std::vector<const ArrayView*> all{&first};
  for (const auto* list : lists) {
    for (const ArrayView& v : *list) all.push_back(&v);
  }
  return common_place(op, all);
}

bool overlaps(const ArrayView& a, const ArrayView& b) {
  const auto* a0 = a.data<char>();
  const auto* b0 = b.data<char>();
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void elementwise_forward(const std::string& kind_name, py::handle inputs_in, py::handle y_in) {
  const char* op = "elementwise_forward";
  const std::vector<ArrayView> inputs = array_list(op, "inputs", inputs_in);
  const nn::ElementWiseOp kind = elementwise_op(op, kind_name, inputs.size());
  const ArrayView y(op, "y", y_in);
  const Place place = common_place_with(op, y, {&inputs});
  dispatch_float(op, y, [&](auto tag) {
    using T = decltype(tag);
    y.require<T>(true);
    std::vector<const T*> ptrs;
    for (const ArrayView& a : inputs) {
      a.require<T>();
      a.require_shape(y.shape());
      ptrs.push_back(a.data<T>());
    }
    const auto k = static_cast<std::int64_t>(ptrs.size());
    SPARKGRAD_RUN_TWIN(place, nn, elementwise_forward<T>, kind, ptrs.data(), k, y.mutable_data<T>(), y.size());
  });
}

void elementwise_backward(const std::string& kind_name, py::handle inputs_in, py::handle dy_in, py::handle dx_in) {
  const char* op = "elementwise_backward";
  const std::vector<ArrayView> inputs = array_list(op, "inputs", inputs_in);
  const nn::ElementWiseOp kind = elementwise_op(op, kind_name, inputs.size());
  const std::vector<ArrayView> dx = array_list(op, "dx", dx_in);
  if (dx.size() != inputs.size()) {
    throw_invalid(op, "dx must hold one array per input (", inputs.size(), "), got ", dx.size());
  }
  const ArrayView dy(op, "dy", dy_in);
  const Place place = common_place_with(op, dy, {&inputs, &dx});
  dispatch_float(op, dy, [&](auto tag) {
    using T = decltype(tag);
    dy.require<T>();
    std::vector<const T*> in_ptrs;
    std::vector<T*> dx_ptrs;
    for (const ArrayView& a : inputs) {
      a.require<T>();
      a.require_shape(dy.shape());
      in_ptrs.push_back(a.data<T>());
    }
    for (std::size_t i = 0; i < dx.size(); ++i) {
      dx[i].require<T>(true);
      dx[i].require_shape(dy.shape());
      dx_ptrs.push_back(dx[i].mutable_data<T>());
      bool alias = overlaps(dx[i], dy);
      for (std::size_t j = 0; j < dx.size(); ++j) {
        alias = alias || overlaps(dx[i], inputs[j]) || (j < i && overlaps(dx[i], dx[j]));
      }
      if (alias) throw_invalid(op, "dx[", i, "] must not overlap dy, an input or another dx");
    }
    const auto k = static_cast<std::int64_t>(in_ptrs.size());
    SPARKGRAD_RUN_TWIN(place, nn, elementwise_backward<T>, kind, in_ptrs.data(), k, dy.data<T>(), dx_ptrs.data(),
                       dy.size());
  });
}

void scale_shift(py::handle x_in, py::handle y_in, double scale, double shift) {
  const char* op = "scale_shift";
  const ArrayView x(op, "x", x_in), y(op, "y", y_in);
  const Place place = common_place(op, {&x, &y});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    y.require_shape(x.shape());
    SPARKGRAD_RUN_TWIN(place, nn, scale_shift<T>, x.data<T>(), y.mutable_data<T>(), x.size(), scale, shift);
  });
}

// (N, ...) viewed as (n, d) rows.
std::pair<std::int64_t, std::int64_t> row_view(const char* op, const ArrayView& a) {
  if (a.ndim() < 1) throw_invalid(op, a.name(), " must have a batch axis, got a 0-d array");
  const std::int64_t n = a.shape(0);
  return {n, n == 0 ? 0 : a.size() / n};
}

void check_eps(const char* op, double eps) {
  if (!(eps > 0.0 && std::isfinite(eps))) throw_invalid(op, "eps must be a finite number > 0, got ", eps);
}

void l2_normalize_forward(py::handle x_in, py::handle y_in, py::handle norms_in, double eps) {
  const char* op = "l2_normalize_forward";
  check_eps(op, eps);
  const ArrayView x(op, "x", x_in), y(op, "y", y_in), norms(op, "norms", norms_in);
  const Place place = common_place(op, {&x, &y, &norms});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    y.require<T>(true);
    norms.require<T>(true);
    y.require_shape(x.shape());
    const auto [n, d] = row_view(op, x);
    norms.require_shape({n});
    if (overlaps(x, y)) throw_invalid(op, "y must not overlap x");
    SPARKGRAD_RUN_TWIN(place, nn, l2_normalize_forward<T>, x.data<T>(), y.mutable_data<T>(), norms.mutable_data<T>(),
                       n, d, eps);
  });
}

void l2_normalize_backward(py::handle y_in, py::handle norms_in, py::handle dy_in, py::handle dx_in, double eps) {
  const char* op = "l2_normalize_backward";
  check_eps(op, eps);
  const ArrayView y(op, "y", y_in), norms(op, "norms", norms_in), dy(op, "dy", dy_in), dx(op, "dx", dx_in);
  const Place place = common_place(op, {&y, &norms, &dy, &dx});
  dispatch_float(op, y, [&](auto tag) {
    using T = decltype(tag);
    y.require<T>();
    norms.require<T>();
    dy.require<T>();
    dx.require<T>(true);
    dy.require_shape(y.shape());
    dx.require_shape(y.shape());
    const auto [n, d] = row_view(op, y);
    norms.require_shape({n});
    SPARKGRAD_RUN_TWIN(place, nn, l2_normalize_backward<T>, y.data<T>(), norms.data<T>(), dy.data<T>(),
                       dx.mutable_data<T>(), n, d, eps);
  });
}

void l2_distance_forward(py::handle a_in, py::handle b_in, py::handle y_in) {
  const char* op = "l2_distance_forward";
  const ArrayView a(op, "a", a_in), b(op, "b", b_in), y(op, "y", y_in);
  const Place place = common_place(op, {&a, &b, &y});
  dispatch_float(op, a, [&](auto tag) {
    using T = decltype(tag);
    a.require<T>();
    b.require<T>();
    y.require<T>(true);
    b.require_shape(a.shape());
    const auto [n, d] = row_view(op, a);
    y.require_shape({n});
    SPARKGRAD_RUN_TWIN(place, nn, l2_distance_forward<T>, a.data<T>(), b.data<T>(), y.mutable_data<T>(), n, d);
  });
}

void l2_distance_backward(py::handle a_in, py::handle b_in, py::handle y_in, py::handle dy_in, py::handle da_in,
                          py::handle db_in, double eps) {
  const char* op = "l2_distance_backward";
  check_eps(op, eps);
  const ArrayView a(op, "a", a_in), b(op, "b", b_in), y(op, "y", y_in), dy(op, "dy", dy_in);
  const ArrayView da(op, "da", da_in), db(op, "db", db_in);
  const Place place = common_place(op, {&a, &b, &y, &dy, &da, &db});
  dispatch_float(op, a, [&](auto tag) {
    using T = decltype(tag);
    a.require<T>();
    b.require<T>();
    y.require<T>();
    dy.require<T>();
    da.require<T>(true);
    db.require<T>(true);
    b.require_shape(a.shape());
    da.require_shape(a.shape());
    db.require_shape(a.shape());
    const auto [n, d] = row_view(op, a);
    y.require_shape({n});
    dy.require_shape({n});
    if (overlaps(da, db) || overlaps(da, a) || overlaps(da, b) || overlaps(db, a) || overlaps(db, b)) {
      throw_invalid(op, "da and db must not overlap each other, a or b");
    }
    SPARKGRAD_RUN_TWIN(place, nn, l2_distance_backward<T>, a.data<T>(), b.data<T>(), y.data<T>(), dy.data<T>(),
                       da.mutable_data<T>(), db.mutable_data<T>(), n, d, eps);
  });
}

// ---- recurrent layers (LSTM, GRU, SimpleRnn) ------------------------------------------------------
// (n, t, c, h) from x: (n, t, c) and w: (c, gates * h); checks rw: (h, gates * h). gates: 4 for the LSTM,
// 3 for the GRU, 1 for SimpleRnn.
nn::LstmShape recurrent_shape(const char* op, const ArrayView& x, const ArrayView& w, const ArrayView& rw,
                              std::int64_t gates) {
  const std::string width = gates == 1 ? "H" : std::to_string(gates) + "H";
  x.require_ndim({3}, "3-D (N, T, C)");
  w.require_ndim({2}, ("2-D (C, " + width + ")").c_str());
  const std::int64_t n = x.shape(0), t = x.shape(1), c = x.shape(2);
  require_positive(op, "x.shape[0] (examples)", n);
  require_positive(op, "x.shape[1] (time steps)", t);
  if (w.shape(0) != c || w.shape(1) % gates != 0 || w.shape(1) == 0) {
    throw_invalid(op, "w must have shape (", c, ", ", width, ") with H >= 1, got ", shape_text(w.shape()));
  }
  const std::int64_t h = w.shape(1) / gates;
  rw.require_shape({h, gates * h});
  return {n, t, c, h};
}

// The optional per-step mask (n, t) and initial states (n, h) of a recurrent call.
template <typename T>
void require_recurrent_optional(const nn::LstmShape& s, const ArrayView& mask,
                                std::initializer_list<const ArrayView*> states) {
  mask.require<T>();
  mask.require_shape({s.n, s.t});
  for (const ArrayView* state : states) {
    state->require<T>();
    state->require_shape({s.n, s.h});
  }
}

void require_first_step(const char* op, const nn::LstmShape& s, std::int64_t first_step) {
  if (first_step < 0 || first_step >= s.t) throw_invalid(op, "first_step must be in [0, ", s.t, "), got ", first_step);
}

void lstm_forward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle b_in, py::handle hs_in,
                  py::handle cs_in, py::handle gates_in, py::handle act_c_in, py::handle mask_in, py::handle h0_in,
                  py::handle c0_in, const std::string& activation, const std::string& gate_activation, double alpha,
                  double gate_alpha) {
  const char* op = "lstm_forward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in), b(op, "b", b_in);
  const ArrayView hs(op, "hs", hs_in), cs(op, "cs", cs_in), gates(op, "gates", gates_in), act_c(op, "act_c", act_c_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const ArrayView c0 = ArrayView::optional(op, "c0", c0_in);
  const Place place = common_place(op, {&x, &w, &rw, &b, &hs, &cs, &gates, &act_c, &mask, &h0, &c0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    b.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 4);
    b.require_shape({4 * s.h});
    for (const ArrayView* out : {&hs, &cs, &gates, &act_c}) out->require<T>(true);
    hs.require_shape({s.n, s.t, s.h});
    cs.require_shape({s.n, s.t, s.h});
    act_c.require_shape({s.n, s.t, s.h});
    gates.require_shape({s.n, s.t, 4 * s.h});
    require_recurrent_optional<T>(s, mask, {&h0, &c0});
    SPARKGRAD_RUN_TWIN(place, nn, lstm_forward<T>, spec, s, x.data<T>(), w.data<T>(), rw.data<T>(), b.data<T>(),
                       mask.data<T>(), h0.data<T>(), c0.data<T>(), hs.mutable_data<T>(), cs.mutable_data<T>(),
                       gates.mutable_data<T>(), act_c.mutable_data<T>());
  });
}

void lstm_backward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle hs_in, py::handle cs_in,
                   py::handle gates_in, py::handle act_c_in, py::handle dh_in, py::handle dgates_in, py::handle dw_in,
                   py::handle drw_in, py::handle db_in, py::handle dx_in, py::handle mask_in, py::handle h0_in,
                   py::handle c0_in, const std::string& activation, const std::string& gate_activation, double alpha,
                   double gate_alpha, std::int64_t first_step) {
  const char* op = "lstm_backward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in);
  const ArrayView hs(op, "hs", hs_in), cs(op, "cs", cs_in), gates(op, "gates", gates_in), act_c(op, "act_c", act_c_in);
  const ArrayView dh(op, "dh", dh_in), dgates(op, "dgates", dgates_in), dw(op, "dw", dw_in), drw(op, "drw", drw_in);
  const ArrayView db(op, "db", db_in), dx = ArrayView::optional(op, "dx", dx_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const ArrayView c0 = ArrayView::optional(op, "c0", c0_in);
  const Place place = common_place(
      op, {&x, &w, &rw, &hs, &cs, &gates, &act_c, &dh, &dgates, &dw, &drw, &db, &dx, &mask, &h0, &c0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 4);
    require_first_step(op, s, first_step);
    const Shape seq{s.n, s.t, s.h};
    for (const ArrayView* in : {&hs, &cs, &act_c, &dh, &gates}) in->require<T>();
    hs.require_shape(seq);
    cs.require_shape(seq);
    act_c.require_shape(seq);
    dh.require_shape(seq);
    gates.require_shape({s.n, s.t, 4 * s.h});
    for (const ArrayView* out : {&dgates, &dw, &drw, &db, &dx}) out->require<T>(true);
    dgates.require_shape({s.n, s.t, 4 * s.h});
    dw.require_shape(w.shape());
    drw.require_shape(rw.shape());
    db.require_shape({4 * s.h});
    dx.require_shape(x.shape());
    require_recurrent_optional<T>(s, mask, {&h0, &c0});
    SPARKGRAD_RUN_TWIN(place, nn, lstm_backward<T>, spec, s, x.data<T>(), w.data<T>(), rw.data<T>(), mask.data<T>(),
                       h0.data<T>(), c0.data<T>(), hs.data<T>(), cs.data<T>(), gates.data<T>(), act_c.data<T>(),
                       dh.data<T>(), dgates.mutable_data<T>(), dx.mutable_data<T>(), dw.mutable_data<T>(),
                       drw.mutable_data<T>(), db.mutable_data<T>(), first_step);
  });
}

void gru_forward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle b_in, py::handle hs_in,
                 py::handle gates_in, py::handle mask_in, py::handle h0_in, const std::string& activation,
                 const std::string& gate_activation, double alpha, double gate_alpha) {
  const char* op = "gru_forward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in), b(op, "b", b_in);
  const ArrayView hs(op, "hs", hs_in), gates(op, "gates", gates_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const Place place = common_place(op, {&x, &w, &rw, &b, &hs, &gates, &mask, &h0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    b.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 3);
    b.require_shape({3 * s.h});
    hs.require<T>(true);
    gates.require<T>(true);
    hs.require_shape({s.n, s.t, s.h});
    gates.require_shape({s.n, s.t, 3 * s.h});
    require_recurrent_optional<T>(s, mask, {&h0});
    SPARKGRAD_RUN_TWIN(place, nn, gru_forward<T>, spec, s, x.data<T>(), w.data<T>(), rw.data<T>(), b.data<T>(),
                       mask.data<T>(), h0.data<T>(), hs.mutable_data<T>(), gates.mutable_data<T>());
  });
}

void gru_backward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle hs_in, py::handle gates_in,
                  py::handle dh_in, py::handle dgates_in, py::handle dw_in, py::handle drw_in, py::handle db_in,
                  py::handle dx_in, py::handle mask_in, py::handle h0_in, const std::string& activation,
                  const std::string& gate_activation, double alpha, double gate_alpha, std::int64_t first_step) {
  const char* op = "gru_backward";
  const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in);
  const ArrayView hs(op, "hs", hs_in), gates(op, "gates", gates_in), dh(op, "dh", dh_in);
  const ArrayView dgates(op, "dgates", dgates_in), dw(op, "dw", dw_in), drw(op, "drw", drw_in), db(op, "db", db_in);
  const ArrayView dx = ArrayView::optional(op, "dx", dx_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const Place place = common_place(op, {&x, &w, &rw, &hs, &gates, &dh, &dgates, &dw, &drw, &db, &dx, &mask, &h0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 3);
    require_first_step(op, s, first_step);
    const Shape seq{s.n, s.t, s.h};
    for (const ArrayView* in : {&hs, &gates, &dh}) in->require<T>();
    hs.require_shape(seq);
    dh.require_shape(seq);
    gates.require_shape({s.n, s.t, 3 * s.h});
    for (const ArrayView* out : {&dgates, &dw, &drw, &db, &dx}) out->require<T>(true);
    dgates.require_shape({s.n, s.t, 3 * s.h});
    dw.require_shape(w.shape());
    drw.require_shape(rw.shape());
    db.require_shape({3 * s.h});
    dx.require_shape(x.shape());
    require_recurrent_optional<T>(s, mask, {&h0});
    SPARKGRAD_RUN_TWIN(place, nn, gru_backward<T>, spec, s, x.data<T>(), w.data<T>(), rw.data<T>(), mask.data<T>(),
                       h0.data<T>(), hs.data<T>(), gates.data<T>(), dh.data<T>(), dgates.mutable_data<T>(),
                       dx.mutable_data<T>(), dw.mutable_data<T>(), drw.mutable_data<T>(), db.mutable_data<T>(),
                       first_step);
  });
}

void simple_rnn_forward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle b_in, py::handle hs_in,
                        py::handle act_in, py::handle mask_in, py::handle h0_in, const std::string& activation,
                        double alpha) {
  const char* op = "simple_rnn_forward";
  const nn::Activation kind = nn::parse_activation(op, activation);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in), b(op, "b", b_in);
  const ArrayView hs(op, "hs", hs_in), act(op, "act", act_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const Place place = common_place(op, {&x, &w, &rw, &b, &hs, &act, &mask, &h0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    b.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 1);
    b.require_shape({s.h});
    hs.require<T>(true);
    act.require<T>(true);
    hs.require_shape({s.n, s.t, s.h});
    act.require_shape({s.n, s.t, s.h});
    require_recurrent_optional<T>(s, mask, {&h0});
    SPARKGRAD_RUN_TWIN(place, nn, simple_rnn_forward<T>, kind, alpha, s, x.data<T>(), w.data<T>(), rw.data<T>(),
                       b.data<T>(), mask.data<T>(), h0.data<T>(), hs.mutable_data<T>(), act.mutable_data<T>());
  });
}

void simple_rnn_backward(py::handle x_in, py::handle w_in, py::handle rw_in, py::handle hs_in, py::handle act_in,
                         py::handle dh_in, py::handle dz_in, py::handle dw_in, py::handle drw_in, py::handle db_in,
                         py::handle dx_in, py::handle mask_in, py::handle h0_in, const std::string& activation,
                         double alpha, std::int64_t first_step) {
  const char* op = "simple_rnn_backward";
  const nn::Activation kind = nn::parse_activation(op, activation);
  const ArrayView x(op, "x", x_in), w(op, "w", w_in), rw(op, "rw", rw_in);
  const ArrayView hs(op, "hs", hs_in), act(op, "act", act_in), dh(op, "dh", dh_in), dz(op, "dz", dz_in);
  const ArrayView dw(op, "dw", dw_in), drw(op, "drw", drw_in), db(op, "db", db_in);
  const ArrayView dx = ArrayView::optional(op, "dx", dx_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in), h0 = ArrayView::optional(op, "h0", h0_in);
  const Place place = common_place(op, {&x, &w, &rw, &hs, &act, &dh, &dz, &dw, &drw, &db, &dx, &mask, &h0});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    w.require<T>();
    rw.require<T>();
    const nn::LstmShape s = recurrent_shape(op, x, w, rw, 1);
    require_first_step(op, s, first_step);
    const Shape seq{s.n, s.t, s.h};
    for (const ArrayView* in : {&hs, &act, &dh}) in->require<T>();
    hs.require_shape(seq);
    act.require_shape(seq);
    dh.require_shape(seq);
    for (const ArrayView* out : {&dz, &dw, &drw, &db, &dx}) out->require<T>(true);
    dz.require_shape(seq);
    dw.require_shape(w.shape());
    drw.require_shape(rw.shape());
    db.require_shape({s.h});
    dx.require_shape(x.shape());
    require_recurrent_optional<T>(s, mask, {&h0});
    SPARKGRAD_RUN_TWIN(place, nn, simple_rnn_backward<T>, kind, alpha, s, x.data<T>(), w.data<T>(), rw.data<T>(),
                       mask.data<T>(), h0.data<T>(), hs.data<T>(), act.data<T>(), dh.data<T>(), dz.mutable_data<T>(),
                       dx.mutable_data<T>(), dw.mutable_data<T>(), drw.mutable_data<T>(), db.mutable_data<T>(),
                       first_step);
  });
}

void layer_norm_forward(py::handle x_in, py::handle gain_in, py::handle bias_in, py::handle y_in, py::handle mean_in,
                        py::handle rstd_in, double eps) {
  const char* op = "layer_norm_forward";
  if (!(eps > 0.0) || !std::isfinite(eps)) throw_invalid(op, "eps must be finite and > 0, got ", eps);
  const ArrayView x(op, "x", x_in), gain(op, "gain", gain_in), y(op, "y", y_in);
  const ArrayView bias = ArrayView::optional(op, "bias", bias_in);
  const ArrayView mean(op, "mean", mean_in), rstd(op, "rstd", rstd_in);
  const Place place = common_place(op, {&x, &gain, &bias, &y, &mean, &rstd});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    x.require_ndim({2}, "2-D (rows, C)");
    const std::int64_t rows = x.shape(0), c = x.shape(1);
    if (c < 1) throw_invalid(op, "x must have at least one column, got shape ", shape_text(x.shape()));
    require_channel_vectors<T>(c, {{&gain, false}});
    bias.require<T>();
    if (bias.present()) bias.require_shape({c});
    y.require<T>(true);
    y.require_shape(x.shape());
    for (const ArrayView* stat : {&mean, &rstd}) {
      stat->require<T>(true);
      stat->require_shape({rows});
    }
    SPARKGRAD_RUN_TWIN(place, nn, layer_norm_forward<T>, x.data<T>(), gain.data<T>(), bias.data<T>(),
                       y.mutable_data<T>(), mean.mutable_data<T>(), rstd.mutable_data<T>(), rows, c, eps);
  });
}

void layer_norm_backward(py::handle x_in, py::handle dy_in, py::handle gain_in, py::handle mean_in,
                         py::handle rstd_in, py::handle dx_in, py::handle dgain_in, py::handle dbias_in) {
  const char* op = "layer_norm_backward";
  const ArrayView x(op, "x", x_in), dy(op, "dy", dy_in), gain(op, "gain", gain_in);
  const ArrayView mean(op, "mean", mean_in), rstd(op, "rstd", rstd_in), dx(op, "dx", dx_in);
  const ArrayView dgain(op, "dgain", dgain_in), dbias = ArrayView::optional(op, "dbias", dbias_in);
  const Place place = common_place(op, {&x, &dy, &gain, &mean, &rstd, &dx, &dgain, &dbias});
  dispatch_float(op, x, [&](auto tag) {
    using T = decltype(tag);
    x.require<T>();
    x.require_ndim({2}, "2-D (rows, C)");
    const std::int64_t rows = x.shape(0), c = x.shape(1);
    if (c < 1) throw_invalid(op, "x must have at least one column, got shape ", shape_text(x.shape()));
    dy.require<T>();
    dy.require_shape(x.shape());
    dx.require<T>(true);
    dx.require_shape(x.shape());
    for (const ArrayView* stat : {&mean, &rstd}) {
      stat->require<T>();
      stat->require_shape({rows});
    }
    require_channel_vectors<T>(c, {{&gain, false}, {&dgain, true}});
    dbias.require<T>(true);
    if (dbias.present()) dbias.require_shape({c});
    SPARKGRAD_RUN_TWIN(place, nn, layer_norm_backward<T>, x.data<T>(), dy.data<T>(), gain.data<T>(), mean.data<T>(),
                       rstd.data<T>(), dx.mutable_data<T>(), dgain.mutable_data<T>(), dbias.mutable_data<T>(), rows,
                       c);
  });
}

// Attention geometry from q (N, TQ, heads*D), k (N, TK, heads*D) and v (N, TK, heads*DV).
nn::AttentionShape attention_shape(const char* op, const ArrayView& q, const ArrayView& k, const ArrayView& v,
                                   std::int64_t heads) {
  require_positive(op, "heads", heads);
  for (const ArrayView* a : {&q, &k, &v}) a->require_ndim({3}, "3-D (N, T, heads * size)");
  if (q.shape(2) % heads != 0 || q.shape(2) == 0) {
    throw_invalid(op, "q's last axis (", q.shape(2), ") must be a positive multiple of heads (", heads, ")");
  }
  if (v.shape(2) % heads != 0 || v.shape(2) == 0) {
    throw_invalid(op, "v's last axis (", v.shape(2), ") must be a positive multiple of heads (", heads, ")");
  }
  const std::int64_t n = q.shape(0), tk = k.shape(1);
  k.require_shape({n, tk, q.shape(2)});
  v.require_shape({n, tk, v.shape(2)});
  if (q.shape(1) < 1 || tk < 1) throw_invalid(op, "q and k need at least one time step");
  return {n, heads, q.shape(1), tk, q.shape(2) / heads, v.shape(2) / heads};
}

void attention_forward(py::handle q_in, py::handle k_in, py::handle v_in, py::handle weights_in, py::handle y_in,
                       std::int64_t heads, double scale, py::handle mask_in) {
  const char* op = "attention_forward";
  if (!std::isfinite(scale)) throw_invalid(op, "scale must be finite, got ", scale);
  const ArrayView q(op, "q", q_in), k(op, "k", k_in), v(op, "v", v_in);
  const ArrayView weights(op, "weights", weights_in), y(op, "y", y_in);
  const ArrayView mask = ArrayView::optional(op, "mask", mask_in);
  const Place place = common_place(op, {&q, &k, &v, &weights, &y, &mask});
  dispatch_float(op, q, [&](auto tag) {
    using T = decltype(tag);
    for (const ArrayView* in : {&q, &k, &v, &mask}) in->require<T>();
    const nn::AttentionShape s = attention_shape(op, q, k, v, heads);
    if (mask.present()) mask.require_shape({s.n, s.tk});
    weights.require<T>(true);
    weights.require_shape({s.n, s.heads, s.tq, s.tk});
    y.require<T>(true);
    y.require_shape({s.n, s.tq, s.heads * s.dv});
    SPARKGRAD_RUN_TWIN(place, nn, attention_forward<T>, s, q.data<T>(), k.data<T>(), v.data<T>(), mask.data<T>(),
                       scale, weights.mutable_data<T>(), y.mutable_data<T>());
  });
}

void attention_backward(py::handle q_in, py::handle k_in, py::handle v_in, py::handle weights_in, py::handle dy_in,
                        py::handle dweights_in, py::handle dq_in, py::handle dk_in, py::handle dv_in,
                        std::int64_t heads, double scale) {
  const char* op = "attention_backward";
  if (!std::isfinite(scale)) throw_invalid(op, "scale must be finite, got ", scale);
  const ArrayView q(op, "q", q_in), k(op, "k", k_in), v(op, "v", v_in), weights(op, "weights", weights_in);
  const ArrayView dy(op, "dy", dy_in), dweights(op, "dweights", dweights_in);
  const ArrayView dq(op, "dq", dq_in), dk(op, "dk", dk_in), dv(op, "dv", dv_in);
  const Place place = common_place(op, {&q, &k, &v, &weights, &dy, &dweights, &dq, &dk, &dv});
  dispatch_float(op, q, [&](auto tag) {
    using T = decltype(tag);
    for (const ArrayView* in : {&q, &k, &v, &weights, &dy}) in->require<T>();
    const nn::AttentionShape s = attention_shape(op, q, k, v, heads);
    weights.require_shape({s.n, s.heads, s.tq, s.tk});
    dy.require_shape({s.n, s.tq, s.heads * s.dv});
    for (const ArrayView* out : {&dweights, &dq, &dk, &dv}) out->require<T>(true);
    dweights.require_shape(weights.shape());
    dq.require_shape(q.shape());
    dk.require_shape(k.shape());
    dv.require_shape(v.shape());
    SPARKGRAD_RUN_TWIN(place, nn, attention_backward<T>, s, q.data<T>(), k.data<T>(), v.data<T>(), weights.data<T>(),
                       dy.data<T>(), scale, dweights.mutable_data<T>(), dq.mutable_data<T>(), dk.mutable_data<T>(),
                       dv.mutable_data<T>());
  });
}

}  // namespace

void init_nn(py::module_& m) {
  m.def("bias_add", &bias_add, py::arg("x"), py::arg("b"), "x[n, c, ...] += b[c] in place; x: (N, C) or (N, C, H, W).");
  m.def("bias_grad", &bias_grad, py::arg("dy"), py::arg("db"), "db[c] = sum of dy over every axis but 1.");
  m.def("swap_last_axes", &swap_last_axes, py::arg("x"), py::arg("y"),
        "y (N, cols, rows) = x (N, rows, cols) with its last two axes swapped; y must not be x.");
  m.def("activation_forward", &activation_forward, py::arg("name"), py::arg("x"), py::arg("y"),
        py::arg("alpha") = 0.0, "y = f(x); softmax over axis 1 of a 2-D array. y may be x.");
  m.def("activation_backward", &activation_backward, py::arg("name"), py::arg("x"), py::arg("y"), py::arg("dy"),
        py::arg("dx"), py::arg("alpha") = 0.0, "dx = dL/dx from x, y = f(x) and dy = dL/dy. dx may be dy.");
  m.def(
      "loss_score",
      [](const std::string& loss, const std::string& activation, py::handle labels, py::handle preout,
         py::handle scores, py::handle mask, double alpha) {
        loss_call<false>("loss_score", loss, activation, labels, preout, scores, mask, alpha);
      },
      py::arg("loss"), py::arg("activation"), py::arg("labels"), py::arg("preout"), py::arg("scores"),
      py::arg("mask") = py::none(), py::arg("alpha") = 0.0,
      "scores (N,) = per-example loss (sum over columns) of activation(preout) against labels, times mask.");
  m.def(
      "loss_gradient",
      [](const std::string& loss, const std::string& activation, py::handle labels, py::handle preout,
         py::handle grad, py::handle mask, double alpha) {
        loss_call<true>("loss_gradient", loss, activation, labels, preout, grad, mask, alpha);
      },
      py::arg("loss"), py::arg("activation"), py::arg("labels"), py::arg("preout"), py::arg("grad"),
      py::arg("mask") = py::none(), py::arg("alpha") = 0.0,
      "grad (N, C) = d(example loss)/d(preout), times mask; not divided by N.");
  m.def("dropout_forward", &dropout_forward, py::arg("x"), py::arg("y"), py::arg("mask"), py::arg("retain"),
        py::arg("seed"), "Inverted dropout: mask = 1/retain with probability retain else 0; y = x * mask.");
  m.def("dropout_backward", &dropout_backward, py::arg("dy"), py::arg("mask"), py::arg("dx"), "dx = dy * mask.");
  m.def(
      "embedding_forward",
      [](py::handle indices, py::handle w, py::handle y) { embedding_call<false>("embedding_forward", indices, w, y); },
      py::arg("indices"), py::arg("w"), py::arg("y"),
      "y (n, dim) = rows of w (vocab, dim) at indices (n,) int64; ValueError for an index outside [0, vocab).");
  m.def(
      "embedding_backward",
      [](py::handle indices, py::handle dy, py::handle dw) {
        embedding_call<true>("embedding_backward", indices, dw, dy);
      },
      py::arg("indices"), py::arg("dy"), py::arg("dw"),
      "dw[indices[i]] += dy[i] (accumulates; deterministic for any thread count); ValueError as embedding_forward.");
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
        "identity or relu (fused). algorithm: auto (per shape and device), im2col, winograd (CPU; 3x3, stride 1, "
        "padding <= 2) or cudnn (GPU).");
  m.def("conv2d_backward_input", &conv2d_backward_input, py::arg("dy"), py::arg("w"), py::arg("dx"),
        py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
        py::arg("algorithm") = "auto", py::arg("b") = py::none(), py::arg("activation") = "identity",
        "dx (N, C, H, W) = activation(conv-input-gradient(dy (N, K, P, Q), w (K, C, R, S)) + b (C)): a transposed "
        "convolution's forward. activation: identity or relu (fused).");
  m.def("conv2d_backward_weight", &conv2d_backward_weight, py::arg("x"), py::arg("dy"), py::arg("dw"),
        py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
        py::arg("algorithm") = "auto",
        "dw (K, C, R, S) from x (N, C, H, W) and dy (N, K, P, Q), summed over the batch.");
  m.def("conv2d_forward_backward_weight", &conv2d_forward_backward_weight, py::arg("x"), py::arg("w"), py::arg("dy"),
        py::arg("y"), py::arg("dw"), py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_top"), py::arg("pad_left"),
        py::arg("algorithm") = "auto",
        "conv2d_forward(x, w, None, y) (y may be None: skipped) and conv2d_backward_weight(x, dy, dw) from one im2col "
        "of x: a transposed convolution's backward (its dL/dx and dL/dW). The same results as the two calls.");
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
  m.def("gru_forward", &gru_forward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("b"), py::arg("hs"),
        py::arg("gates"), py::arg("mask") = py::none(), py::arg("h0") = py::none(), py::arg("activation") = "tanh",
        py::arg("gate_activation") = "sigmoid", py::arg("alpha") = 0.0, py::arg("gate_alpha") = 0.0,
        "GRU (libnd4j's cell, reset before the recurrent product) over x (N, T, C) with w (C, 3H), rw (H, 3H), "
        "b (3H), gate order [r, u, c]: writes hs (N, T, H) and the activated gates (N, T, 3H). mask (N, T) "
        "multiplies h per step.");
  m.def("gru_backward", &gru_backward, py::arg("x"), py::arg("w"), py::arg("rw"), py::arg("hs"), py::arg("gates"),
        py::arg("dh"), py::arg("dgates"), py::arg("dw"), py::arg("drw"), py::arg("db"), py::arg("dx") = py::none(),
        py::arg("mask") = py::none(), py::arg("h0") = py::none(), py::arg("activation") = "tanh",
        py::arg("gate_activation") = "sigmoid", py::arg("alpha") = 0.0, py::arg("gate_alpha") = 0.0,
        py::arg("first_step") = 0,
        "Backward of gru_forward given dh = dL/dhs (N, T, H): writes dgates = dL/d(pre-activations), dw, drw, db "
        "and dx (if given); steps before first_step get no gradient (truncated BPTT).");
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
  m.def("layer_norm_forward", &layer_norm_forward, py::arg("x"), py::arg("gain"), py::arg("bias"), py::arg("y"),
        py::arg("mean"), py::arg("rstd"), py::arg("eps") = 1e-5,
        "Layer normalization of each row of x (rows, C): y = (x - mean) rstd gain + bias (bias None: none), "
        "rstd = 1 / sqrt(biased var + eps); writes mean and rstd (rows,).");
  m.def("layer_norm_backward", &layer_norm_backward, py::arg("x"), py::arg("dy"), py::arg("gain"), py::arg("mean"),
        py::arg("rstd"), py::arg("dx"), py::arg("dgain"), py::arg("dbias") = py::none(),
        "Backward of layer_norm_forward: dx (rows, C), dgain and dbias (C,) (dbias None: not written); the column "
        "sums are the same bits for any thread count. dx may be dy.");
  m.def("attention_forward", &attention_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("weights"),
        py::arg("y"), py::arg("heads"), py::arg("scale"), py::arg("mask") = py::none(),
        "Multi-head dot-product attention: per example and head, weights (N, heads, TQ, TK) = softmax(scale q k^T) "
        "over the keys whose mask (N, TK) is non-zero (masked keys 0; none present: all 0), y = weights v. Heads "
        "interleaved in the last axis: q (N, TQ, heads*D), k (N, TK, heads*D), v (N, TK, heads*DV), y (N, TQ, "
        "heads*DV).");
  m.def("attention_backward", &attention_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("weights"),
        py::arg("dy"), py::arg("dweights"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("heads"),
        py::arg("scale"),
        "Backward of attention_forward given its weights and dy (N, TQ, heads*DV): writes dq, dk, dv (dweights is "
        "scratch, shaped as weights).");
}
