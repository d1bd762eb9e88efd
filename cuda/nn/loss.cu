// CUDA twin of cpp/src/nn/loss.cpp (DL4J definitions): one thread per example row. Softmax+MCXENT/NLL and
// sigmoid+XENT are fused (stable log-sum-exp, gradient p - y); every other pair goes through dL/dp and
// the activation's backward pass, as on the CPU.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

constexpr double kEps = 1e-10;  // DL4J's probability clip, as on the CPU

bool fused_softmax(const LossSpec& s) {
  return (s.loss == Loss::Mcxent || s.loss == Loss::NegativeLogLikelihood) && s.activation == Activation::Softmax;
}
bool fused_sigmoid(const LossSpec& s) { return s.loss == Loss::Xent && s.activation == Activation::Sigmoid; }

template <typename T>
__device__ T mask_weight(const T* mask, MaskLayout layout, std::int64_t i, std::int64_t j, std::int64_t c) {
  if (layout == MaskLayout::PerExample) return mask[i];
  if (layout == MaskLayout::PerOutput) return mask[i * c + j];
  return T(1);
}

template <typename T>
__device__ T clipped_log(T p) {
  return log(fmax(p, T(kEps)));
}
template <typename T>
__device__ T log_sigmoid(T z) {
  const T softplus_neg = z < T(0) ? -z + log1p(exp(z)) : log1p(exp(-z));
  return fmax(-softplus_neg, T(log(kEps)));
}

template <typename T>
__device__ T loss_term(Loss loss, T y, T p, std::int64_t c) {
  switch (loss) {
    case Loss::Mcxent:
    case Loss::NegativeLogLikelihood: return -y * clipped_log(p);
    case Loss::Xent: return -(y * clipped_log(p) + (T(1) - y) * clipped_log(T(1) - p));
    case Loss::L2: return (y - p) * (y - p);
    case Loss::Mse: return (y - p) * (y - p) / T(c);
    case Loss::L1: return fabs(y - p);
    case Loss::Hinge: return fmax(T(0), T(1) - y * p);
    case Loss::SquaredHinge: {
      const T h = fmax(T(0), T(1) - y * p);
      return h * h;
    }
    case Loss::KlDivergence: return y > T(0) ? y * (log(y) - clipped_log(p)) : T(0);
  }
  return T(0);
}

template <typename T>
__device__ T loss_term_grad(Loss loss, T y, T p, std::int64_t c) {
  switch (loss) {
    case Loss::Mcxent:
    case Loss::NegativeLogLikelihood:
    case Loss::KlDivergence: return -y / fmax(p, T(kEps));
    case Loss::Xent: return -(y / fmax(p, T(kEps))) + (T(1) - y) / fmax(T(1) - p, T(kEps));
    case Loss::L2: return T(2) * (p - y);
    case Loss::Mse: return T(2) * (p - y) / T(c);
    case Loss::L1: return p > y ? T(1) : (p < y ? T(-1) : T(0));
    case Loss::Hinge: return T(1) - y * p > T(0) ? -y : T(0);
    case Loss::SquaredHinge: return T(-2) * y * fmax(T(0), T(1) - y * p);
  }
  return T(0);
}

// labels, preout, p: (n, c); p is null for the fused pairs; scores: (n).
template <typename T>
__global__ void score_kernel(Loss loss, bool softmax, bool sigmoid, const T* labels, const T* preout, const T* p,
                             const T* mask, MaskLayout layout, T* scores, std::int64_t n, std::int64_t c) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const T* yi = labels + i * c;
    const T* zi = preout + i * c;
    T log_norm = 0;
    if (softmax) {
      T peak = zi[0];
      for (std::int64_t j = 1; j < c; ++j) peak = fmax(peak, zi[j]);
      T sum = 0;
      for (std::int64_t j = 0; j < c; ++j) sum += exp(zi[j] - peak);
      log_norm = peak + log(sum);
    }
    T score = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      T term;
      if (softmax) {
        term = -yi[j] * fmax(zi[j] - log_norm, T(log(kEps)));
      } else if (sigmoid) {
        term = -(yi[j] * log_sigmoid(zi[j]) + (T(1) - yi[j]) * log_sigmoid(-zi[j]));
      } else {
        term = loss_term(loss, yi[j], p[i * c + j], c);
      }
      score += mask_weight(mask, layout, i, j, c) * term;
    }
    scores[i] = score;
  }
}

template <typename T>
__global__ void term_grad_kernel(Loss loss, const T* labels, const T* p, T* grad, std::int64_t total,
                                 std::int64_t c) {
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) grad[e] = loss_term_grad(loss, labels[e], p[e], c);
}

// Fused gradients and the mask, per row.
template <typename T>
__global__ void finish_grad_kernel(bool softmax, bool sigmoid, const T* labels, const T* p, const T* mask,
                                   MaskLayout layout, T* grad, std::int64_t n, std::int64_t c) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const T* yi = labels + i * c;
    const T* pi = p + i * c;
    T* gi = grad + i * c;
    if (softmax) {
      T label_sum = 0;
      for (std::int64_t j = 0; j < c; ++j) label_sum += yi[j];
      for (std::int64_t j = 0; j < c; ++j) gi[j] = pi[j] * label_sum - yi[j];
    } else if (sigmoid) {
      for (std::int64_t j = 0; j < c; ++j) gi[j] = pi[j] - yi[j];
    }
    if (layout != MaskLayout::None) {
      for (std::int64_t j = 0; j < c; ++j) gi[j] *= mask_weight(mask, layout, i, j, c);
    }
  }
}

}  // namespace

template <typename T>
void loss_score(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                T* scores, std::int64_t n, std::int64_t c) {
  const char* op = "loss_score";
  if (n == 0) return;
  const bool softmax = fused_softmax(spec), sigmoid = fused_sigmoid(spec);
  DeviceBuffer<T> p(op, softmax || sigmoid ? 0 : n * c);
  if (!softmax && !sigmoid) cuda::activation_forward(spec.activation, spec.alpha, preout, p.get(), n, c);
  score_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(spec.loss, softmax, sigmoid, labels, preout,
                                            softmax || sigmoid ? nullptr : p.get(), mask, layout, scores, n, c);
  check_kernels(op);
}

template <typename T>
void loss_gradient(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                   T* grad, std::int64_t n, std::int64_t c) {
  const char* op = "loss_gradient";
  if (n * c == 0) return;
  DeviceBuffer<T> p(op, n * c);
  cuda::activation_forward(spec.activation, spec.alpha, preout, p.get(), n, c);
  const bool softmax = fused_softmax(spec), sigmoid = fused_sigmoid(spec);
  if (!softmax && !sigmoid) {
    term_grad_kernel<<<blocks_for(n * c), kThreads, 0, gpu::current_stream()>>>(spec.loss, labels, p.get(), grad, n * c, c);
    check_kernels(op);
    cuda::activation_backward(spec.activation, spec.alpha, preout, p.get(), grad, grad, n, c);
  }
  finish_grad_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(softmax, sigmoid, labels, p.get(), mask, layout, grad, n, c);
  check_kernels(op);
}

#define SPARKGRAD_LOSS(T)                                                                                \
  template void loss_score<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, \
                              std::int64_t);                                                             \
  template void loss_gradient<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, \
                                 std::int64_t);
SPARKGRAD_LOSS(float)
SPARKGRAD_LOSS(double)

}  // namespace sparkgrad::nn::cuda
