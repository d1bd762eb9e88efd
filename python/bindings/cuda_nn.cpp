// CUDA entry points of the nn and optim kernels (cuda/nn, cuda/optim; the throwing stand-ins of
// cuda/no_cuda.cpp in the CPU build), plus the GPU inventory for `sparkgrad info`. Like the cuda_*
// codecs of compress.cpp they take raw device pointers and sizes: sparkgrad.cuda reads them from each
// array's __cuda_array_interface__ and checks shapes and dtypes first. The dtype travels as its name
// ("float32" / "float64"), so every entry point runs with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"
#include "sparkgrad/optim.h"

namespace py = pybind11;
using namespace sparkgrad;

namespace {

using Ptr = std::uintptr_t;
using Release = py::call_guard<py::gil_scoped_release>;

template <typename T>
T* dev(Ptr p) {
  return reinterpret_cast<T*>(p);
}

// Calls fn(T{}) with T = float or double after the dtype name.
template <typename Fn>
auto with_dtype(const char* op, const std::string& dtype, Fn&& fn) {
  if (dtype == "float32") return fn(float{});
  if (dtype == "float64") return fn(double{});
  throw_invalid(op, "dtype must be float32 or float64, got ", dtype);
}

nn::MaskLayout mask_layout(const char* op, int layout) {
  if (layout < 0 || layout > 2) throw_invalid(op, "mask layout must be 0, 1 or 2, got ", layout);
  return static_cast<nn::MaskLayout>(layout);
}

// The element-wise op of a vertex with k inputs (k >= 1; subtract takes exactly 2).
nn::ElementWiseOp elementwise_op(const char* op, const std::string& name, std::size_t k) {
  const nn::ElementWiseOp kind = nn::parse_elementwise_op(op, name);
  if (k == 0) throw_invalid(op, "inputs must hold at least one array");
  if (kind == nn::ElementWiseOp::Subtract && k != 2) throw_invalid(op, "subtract needs exactly 2 inputs, got ", k);
  return kind;
}

// Typed device pointers from the raw addresses.
template <typename T>
std::vector<T*> dev_list(const std::vector<Ptr>& ptrs) {
  std::vector<T*> out;
  out.reserve(ptrs.size());
  for (Ptr p : ptrs) out.push_back(dev<T>(p));
  return out;
}

}  // namespace

void init_cuda(py::module_& m) {
  m.def("cuda_built", &gpu::built, "True in a CUDA build of the extension.");
  m.def(
      "cuda_set_stream", [](Ptr stream) { gpu::set_stream(stream); }, py::arg("stream"),
      "Runs the calling thread's CUDA ops on the current device on this stream (a raw cudaStream_t; "
      "sparkgrad.cuda passes CuPy's current stream before each op). No-op in the CPU build.");
  m.def("cuda_set_sync_each_op", &gpu::set_sync_each_op, py::arg("on"),
        "Debug switch: every CUDA op waits for the device before it returns.");
  m.def("cuda_sync_each_op", &gpu::sync_each_op, "Whether every CUDA op waits for the device.");
  m.def(
      "cuda_devices",
      []() {
        py::list out;
        for (const auto& d : gpu::devices()) {
          py::dict info;
          info["index"] = d.index;
          info["name"] = d.name;
          info["compute_capability"] = py::make_tuple(d.major, d.minor);
          info["total_memory"] = d.total_memory;
          out.append(info);
        }
        return out;
      },
      "The GPUs the CUDA runtime sees: index, name, compute_capability, total_memory (bytes).");
  m.def(
      "cuda_gemm",
      [](bool ta, bool tb, std::int64_t mm, std::int64_t n, std::int64_t k, double alpha, Ptr a, std::int64_t lda,
         Ptr b, std::int64_t ldb, double beta, Ptr c, std::int64_t ldc, const std::string& dtype) {
        with_dtype("gemm", dtype, [&](auto tag) {
          using T = decltype(tag);
          gpu::gemm<T>(ta ? Transpose::Yes : Transpose::No, tb ? Transpose::Yes : Transpose::No, mm, n, k,
                        static_cast<T>(alpha), dev<const T>(a), lda, dev<const T>(b), ldb, static_cast<T>(beta),
                        dev<T>(c), ldc);
        });
      },
      Release());
  m.def(
      "cuda_bias_add",
      [](Ptr x, Ptr b, std::int64_t n, std::int64_t c, std::int64_t inner, const std::string& dtype) {
        with_dtype("bias_add", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::bias_add(dev<T>(x), dev<const T>(b), n, c, inner);
        });
      },
      Release());
  m.def(
      "cuda_bias_grad",
      [](Ptr dy, Ptr db, std::int64_t n, std::int64_t c, std::int64_t inner, const std::string& dtype) {
        with_dtype("bias_grad", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::bias_grad(dev<const T>(dy), dev<T>(db), n, c, inner);
        });
      },
      Release());
  m.def(
      "cuda_activation_forward",
      [](const std::string& name, double alpha, Ptr x, Ptr y, std::int64_t rows, std::int64_t cols,
         const std::string& dtype) {
        const char* op = "activation_forward";
        const nn::Activation kind = nn::parse_activation(op, name);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::activation_forward(kind, alpha, dev<const T>(x), dev<T>(y), rows, cols);
        });
      },
      Release());
  m.def(
      "cuda_activation_backward",
      [](const std::string& name, double alpha, Ptr x, Ptr y, Ptr dy, Ptr dx, std::int64_t rows, std::int64_t cols,
         const std::string& dtype) {
        const char* op = "activation_backward";
        const nn::Activation kind = nn::parse_activation(op, name);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::activation_backward(kind, alpha, dev<const T>(x), dev<const T>(y), dev<const T>(dy), dev<T>(dx),
                                        rows, cols);
        });
      },
      Release());
  m.def(
      "cuda_loss",
      [](bool gradient, const std::string& loss, const std::string& activation, double alpha, Ptr labels,
         Ptr preout, Ptr mask, int layout, Ptr out, std::int64_t n, std::int64_t c, const std::string& dtype) {
        const char* op = gradient ? "loss_gradient" : "loss_score";
        const nn::LossSpec spec{nn::parse_loss(op, loss), nn::parse_activation(op, activation), alpha};
        const nn::MaskLayout ml = mask_layout(op, layout);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          if (gradient) {
            nn::cuda::loss_gradient(spec, dev<const T>(labels), dev<const T>(preout), dev<const T>(mask), ml,
                                    dev<T>(out), n, c);
          } else {
            nn::cuda::loss_score(spec, dev<const T>(labels), dev<const T>(preout), dev<const T>(mask), ml,
                                 dev<T>(out), n, c);
          }
        });
      },
      Release());
  m.def(
      "cuda_dropout_forward",
      [](Ptr x, Ptr y, Ptr mask, std::int64_t size, double retain, std::uint64_t seed, const std::string& dtype) {
        const char* op = "dropout_forward";
        if (!(retain > 0.0 && retain <= 1.0)) throw_invalid(op, "retain must be in (0, 1], got ", retain);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::dropout_forward(dev<const T>(x), dev<T>(y), dev<T>(mask), size, retain, seed);
        });
      },
      Release());
  m.def(
      "cuda_dropout_backward",
      [](Ptr dy, Ptr mask, Ptr dx, std::int64_t size, const std::string& dtype) {
        with_dtype("dropout_backward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::dropout_backward(dev<const T>(dy), dev<const T>(mask), dev<T>(dx), size);
        });
      },
      Release());
  // g: (n, c, h, w, k, r, s, p, q, stride_h, stride_w, pad_top, pad_left); which: 0 forward (a = x,
  // b = weights, bias, out = y), 1 backward input (a = dy, b = weights, out = dx), 2 backward weight
  // (a = x, b = dy, out = dw).
  m.def(
      "cuda_conv2d",
      [](int which, const std::array<std::int64_t, 13>& s, Ptr a, Ptr b, Ptr bias, Ptr out, bool relu,
         const std::string& algorithm, const std::string& dtype) {
        const nn::Conv2dShape g{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12]};
        const char* op = which == 0 ? "conv2d_forward" : which == 1 ? "conv2d_backward_input" : "conv2d_backward_weight";
        // checked here, before any kernel: auto is resolved per call by the twins (cuda/nn/conv2d.cu)
        const nn::ConvAlgorithm algo = nn::parse_conv_algorithm(op, algorithm);
        nn::cuda::conv2d_algorithm(op, g, algo);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          if (which == 0) {
            nn::cuda::conv2d_forward(g, dev<const T>(a), dev<const T>(b), dev<const T>(bias), dev<T>(out), relu, algo);
          } else if (which == 1) {
            nn::cuda::conv2d_backward_input(g, dev<const T>(a), dev<const T>(b), dev<T>(out), algo);
          } else {
            nn::cuda::conv2d_backward_weight(g, dev<const T>(a), dev<const T>(b), dev<T>(out), algo);
          }
        });
      },
      Release());
  // g: (n, c, h, w, p, q, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left); x -> y forward,
  // dy -> dx backward.
  m.def(
      "cuda_pool2d",
      [](bool backward, const std::string& kind, const std::array<std::int64_t, 12>& s, Ptr in, Ptr out,
         Ptr argmax, const std::string& dtype) {
        const char* op = backward ? "pool2d_backward" : "pool2d_forward";
        const nn::PoolKind k = nn::parse_pool_kind(op, kind, false);
        const nn::Pool2dShape g{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11]};
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          if (backward) nn::cuda::pool2d_backward(k, g, dev<const T>(in), dev<T>(out), dev<const std::int64_t>(argmax));
          else nn::cuda::pool2d_forward(k, g, dev<const T>(in), dev<T>(out), dev<std::int64_t>(argmax));
        });
      },
      Release());
  m.def(
      "cuda_global_pool",
      [](bool backward, const std::string& kind, Ptr in, Ptr out, Ptr argmax, std::int64_t planes,
         std::int64_t size, const std::string& dtype) {
        const char* op = backward ? "global_pool_backward" : "global_pool_forward";
        const nn::PoolKind k = nn::parse_pool_kind(op, kind, true);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          if (backward) {
            nn::cuda::global_pool_backward(k, dev<const T>(in), dev<T>(out), dev<const std::int64_t>(argmax), planes,
                                           size);
          } else {
            nn::cuda::global_pool_forward(k, dev<const T>(in), dev<T>(out), dev<std::int64_t>(argmax), planes, size);
          }
        });
      },
      Release());
  m.def(
      "cuda_batchnorm_forward_train",
      [](const std::array<std::int64_t, 3>& s, Ptr x, Ptr gamma, Ptr beta, Ptr y, Ptr batch_mean, Ptr batch_var,
         Ptr running_mean, Ptr running_var, double decay, double eps, const std::string& dtype) {
        with_dtype("batchnorm_forward_train", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::batchnorm_forward_train(nn::BatchNormShape{s[0], s[1], s[2]}, dev<const T>(x), dev<const T>(gamma),
                                            dev<const T>(beta), dev<T>(y), dev<T>(batch_mean), dev<T>(batch_var),
                                            dev<T>(running_mean), dev<T>(running_var), decay, eps);
        });
      },
      Release());
  m.def(
      "cuda_batchnorm_forward_inference",
      [](const std::array<std::int64_t, 3>& s, Ptr x, Ptr gamma, Ptr beta, Ptr running_mean, Ptr running_var, Ptr y,
         double eps, const std::string& dtype) {
        with_dtype("batchnorm_forward_inference", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::batchnorm_forward_inference(nn::BatchNormShape{s[0], s[1], s[2]}, dev<const T>(x),
                                                dev<const T>(gamma), dev<const T>(beta), dev<const T>(running_mean),
                                                dev<const T>(running_var), dev<T>(y), eps);
        });
      },
      Release());
  m.def(
      "cuda_batchnorm_backward",
      [](const std::array<std::int64_t, 3>& s, Ptr x, Ptr dy, Ptr gamma, Ptr batch_mean, Ptr batch_var, Ptr dx,
         Ptr dgamma, Ptr dbeta, double eps, const std::string& dtype) {
        with_dtype("batchnorm_backward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::batchnorm_backward(nn::BatchNormShape{s[0], s[1], s[2]}, dev<const T>(x), dev<const T>(dy),
                                       dev<const T>(gamma), dev<const T>(batch_mean), dev<const T>(batch_var),
                                       dev<T>(dx), dev<T>(dgamma), dev<T>(dbeta), eps);
        });
      },
      Release());
  // s: (n, t, c, h); mask, h0, c0 are 0 when absent.
  m.def(
      "cuda_lstm_forward",
      [](const std::array<std::int64_t, 4>& s, Ptr x, Ptr w, Ptr rw, Ptr b, Ptr mask, Ptr h0, Ptr c0, Ptr hs, Ptr cs,
         Ptr gates, Ptr act_c, const std::string& activation, const std::string& gate_activation, double alpha,
         double gate_alpha, const std::string& dtype) {
        const char* op = "lstm_forward";
        const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::lstm_forward(spec, nn::LstmShape{s[0], s[1], s[2], s[3]}, dev<const T>(x), dev<const T>(w),
                                 dev<const T>(rw), dev<const T>(b), dev<const T>(mask), dev<const T>(h0),
                                 dev<const T>(c0), dev<T>(hs), dev<T>(cs), dev<T>(gates), dev<T>(act_c));
        });
      },
      Release());
  // s: (n, t, c, h); dx, mask, h0, c0 are 0 when absent.
  m.def(
      "cuda_lstm_backward",
      [](const std::array<std::int64_t, 4>& s, Ptr x, Ptr w, Ptr rw, Ptr mask, Ptr h0, Ptr c0, Ptr hs, Ptr cs,
         Ptr gates, Ptr act_c, Ptr dh, Ptr dgates, Ptr dx, Ptr dw, Ptr drw, Ptr db, std::int64_t first_step,
         const std::string& activation, const std::string& gate_activation, double alpha, double gate_alpha,
         const std::string& dtype) {
        const char* op = "lstm_backward";
        const nn::LstmSpec spec = nn::parse_lstm_spec(op, activation, alpha, gate_activation, gate_alpha);
        if (first_step < 0 || first_step >= s[1]) {
          throw_invalid(op, "first_step must be in [0, ", s[1], "), got ", first_step);
        }
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::lstm_backward(spec, nn::LstmShape{s[0], s[1], s[2], s[3]}, dev<const T>(x), dev<const T>(w),
                                  dev<const T>(rw), dev<const T>(mask), dev<const T>(h0), dev<const T>(c0),
                                  dev<const T>(hs), dev<const T>(cs), dev<const T>(gates), dev<const T>(act_c),
                                  dev<const T>(dh), dev<T>(dgates), dev<T>(dx), dev<T>(dw), dev<T>(drw), dev<T>(db),
                                  first_step);
        });
      },
      Release());
  m.def(
      "cuda_elementwise_forward",
      [](const std::string& kind, const std::vector<Ptr>& inputs, Ptr y, std::int64_t size,
         const std::string& dtype) {
        const char* op = "elementwise_forward";
        const nn::ElementWiseOp k = elementwise_op(op, kind, inputs.size());
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          const auto in = dev_list<const T>(inputs);
          nn::cuda::elementwise_forward(k, in.data(), static_cast<std::int64_t>(in.size()), dev<T>(y), size);
        });
      },
      Release());
  m.def(
      "cuda_elementwise_backward",
      [](const std::string& kind, const std::vector<Ptr>& inputs, Ptr dy, const std::vector<Ptr>& dx,
         std::int64_t size, const std::string& dtype) {
        const char* op = "elementwise_backward";
        const nn::ElementWiseOp k = elementwise_op(op, kind, inputs.size());
        if (dx.size() != inputs.size()) {
          throw_invalid(op, "dx must hold one array per input (", inputs.size(), "), got ", dx.size());
        }
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          const auto in = dev_list<const T>(inputs);
          const auto out = dev_list<T>(dx);
          nn::cuda::elementwise_backward(k, in.data(), static_cast<std::int64_t>(in.size()), dev<const T>(dy),
                                         out.data(), size);
        });
      },
      Release());
  m.def(
      "cuda_scale_shift",
      [](Ptr x, Ptr y, std::int64_t size, double scale, double shift, const std::string& dtype) {
        with_dtype("scale_shift", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::scale_shift(dev<const T>(x), dev<T>(y), size, scale, shift);
        });
      },
      Release());
  m.def(
      "cuda_l2_normalize_forward",
      [](Ptr x, Ptr y, Ptr norms, std::int64_t n, std::int64_t d, double eps, const std::string& dtype) {
        with_dtype("l2_normalize_forward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::l2_normalize_forward(dev<const T>(x), dev<T>(y), dev<T>(norms), n, d, eps);
        });
      },
      Release());
  m.def(
      "cuda_l2_normalize_backward",
      [](Ptr y, Ptr norms, Ptr dy, Ptr dx, std::int64_t n, std::int64_t d, double eps, const std::string& dtype) {
        with_dtype("l2_normalize_backward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::l2_normalize_backward(dev<const T>(y), dev<const T>(norms), dev<const T>(dy), dev<T>(dx), n, d,
                                          eps);
        });
      },
      Release());
  m.def(
      "cuda_l2_distance_forward",
      [](Ptr a, Ptr b, Ptr y, std::int64_t n, std::int64_t d, const std::string& dtype) {
        with_dtype("l2_distance_forward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::l2_distance_forward(dev<const T>(a), dev<const T>(b), dev<T>(y), n, d);
        });
      },
      Release());
  m.def(
      "cuda_l2_distance_backward",
      [](Ptr a, Ptr b, Ptr y, Ptr dy, Ptr da, Ptr db, std::int64_t n, std::int64_t d, double eps,
         const std::string& dtype) {
        with_dtype("l2_distance_backward", dtype, [&](auto tag) {
          using T = decltype(tag);
          nn::cuda::l2_distance_backward(dev<const T>(a), dev<const T>(b), dev<const T>(y), dev<const T>(dy),
                                         dev<T>(da), dev<T>(db), n, d, eps);
        });
      },
      Release());
  m.def(
      "cuda_updater_apply",
      [](const std::string& kind, Ptr gradient, Ptr state, std::int64_t n, std::int64_t iteration,
         const std::array<double, 7>& h, const std::string& dtype) {
        const char* op = "updater_apply";
        const optim::UpdaterKind k = optim::parse_updater(op, kind);
        if (iteration < 0) throw_invalid(op, "iteration must be >= 0, got ", iteration);
        const optim::UpdaterHyper hyper{h[0], h[1], h[2], h[3], h[4], h[5], h[6]};
        with_dtype(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          optim::cuda::updater_apply(k, hyper, dev<T>(gradient), dev<T>(state), n, iteration);
        });
      },
      Release());
  m.def(
      "cuda_regularize_gradient",
      [](Ptr params, Ptr grad, std::int64_t n, double l1, double l2, const std::string& dtype) {
        with_dtype("regularize_gradient", dtype, [&](auto tag) {
          using T = decltype(tag);
          optim::cuda::regularize_gradient(dev<const T>(params), dev<T>(grad), n, l1, l2);
        });
      },
      Release());
  m.def(
      "cuda_apply_weight_decay",
      [](Ptr params, Ptr update, std::int64_t n, double coeff, const std::string& dtype) {
        with_dtype("apply_weight_decay", dtype, [&](auto tag) {
          using T = decltype(tag);
          optim::cuda::apply_weight_decay(dev<const T>(params), dev<T>(update), n, coeff);
        });
      },
      Release());
}
