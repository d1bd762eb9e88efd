// Loss scores and gradients with respect to the pre-activation output, DL4J definitions. Softmax+MCXENT/NLL
// and sigmoid+XENT are fused (stable log-sum-exp, gradient p - y); every other pair goes through dL/dp
// and activation_backward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

Loss parse_loss(const char* op, const std::string& name) {
  static const std::pair<const char*, Loss> kNames[] = {
      {"mcxent", Loss::Mcxent}, {"negativeloglikelihood", Loss::NegativeLogLikelihood},
      {"mse", Loss::Mse},       {"l1", Loss::L1},
      {"l2", Loss::L2},         {"xent", Loss::Xent},
      {"hinge", Loss::Hinge},   {"squared_hinge", Loss::SquaredHinge},
      {"kl_divergence", Loss::KlDivergence},
  };
  for (const auto& [key, value] : kNames) {
    if (name == key) return value;
  }
  throw_invalid(op, "unknown loss '", name,
                "', expected one of mcxent negativeloglikelihood mse l1 l2 xent hinge squared_hinge kl_divergence");
}

namespace {

// Probabilities are clipped to this before any log or division (DL4J's clip epsilon).
constexpr double kEps = 1e-10;

bool is_log_loss(Loss loss) { return loss == Loss::Mcxent || loss == Loss::NegativeLogLikelihood; }
bool fused_softmax(const LossSpec& s) { return is_log_loss(s.loss) && s.activation == Activation::Softmax; }
bool fused_sigmoid(const LossSpec& s) { return s.loss == Loss::Xent && s.activation == Activation::Sigmoid; }

template <typename T>
T mask_weight(const T* mask, MaskLayout layout, std::int64_t i, std::int64_t j, std::int64_t c) {
  switch (layout) {
    case MaskLayout::PerExample: return mask[i];
    case MaskLayout::PerOutput: return mask[i * c + j];
    case MaskLayout::None: break;
  }
  return T(1);
}

// log of a clipped probability, and the stable log-sigmoid log(1 / (1 + e^-z)) clipped the same way.
template <typename T>
T clipped_log(T p) {
  return std::log(std::max(p, T(kEps)));
}
template <typename T>
T log_sigmoid(T z) {
  const T softplus_neg = z < T(0) ? -z + std::log1p(std::exp(z)) : std::log1p(std::exp(-z));
  return std::max(-softplus_neg, T(std::log(kEps)));
}

// One (label, probability) term of a non-fused loss over c columns.
template <typename T>
T loss_term(Loss loss, T y, T p, std::int64_t c) {
  switch (loss) {
    case Loss::Mcxent:
    case Loss::NegativeLogLikelihood: return -y * clipped_log(p);
    case Loss::Xent: return -(y * clipped_log(p) + (T(1) - y) * clipped_log(T(1) - p));
    case Loss::L2: return (y - p) * (y - p);
    case Loss::Mse: return (y - p) * (y - p) / T(c);
    case Loss::L1: return std::abs(y - p);
    case Loss::Hinge: return std::max(T(0), T(1) - y * p);
    case Loss::SquaredHinge: {
      const T h = std::max(T(0), T(1) - y * p);
      return h * h;
    }
    case Loss::KlDivergence: return y > T(0) ? y * (std::log(y) - clipped_log(p)) : T(0);
  }
  return T(0);
}

// d(loss_term)/dp.
template <typename T>
T loss_term_grad(Loss loss, T y, T p, std::int64_t c) {
  switch (loss) {
    case Loss::Mcxent:
    case Loss::NegativeLogLikelihood:
    case Loss::KlDivergence: return -y / std::max(p, T(kEps));
    case Loss::Xent: return -(y / std::max(p, T(kEps))) + (T(1) - y) / std::max(T(1) - p, T(kEps));
    case Loss::L2: return T(2) * (p - y);
    case Loss::Mse: return T(2) * (p - y) / T(c);
    case Loss::L1: return p > y ? T(1) : (p < y ? T(-1) : T(0));
    case Loss::Hinge: return T(1) - y * p > T(0) ? -y : T(0);
    case Loss::SquaredHinge: return T(-2) * y * std::max(T(0), T(1) - y * p);
  }
  return T(0);
}

template <typename T>
std::vector<T> probabilities(const LossSpec& spec, const T* preout, std::int64_t n, std::int64_t c) {
  std::vector<T> p(static_cast<std::size_t>(n * c));
  activation_forward(spec.activation, spec.alpha, preout, p.data(), n, c);
  return p;
}

}  // namespace

template <typename T>
void loss_score(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                T* scores, std::int64_t n, std::int64_t c) {
  const bool softmax = fused_softmax(spec), sigmoid = fused_sigmoid(spec);
  const std::vector<T> p = (softmax || sigmoid) ? std::vector<T>() : probabilities(spec, preout, n, c);
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const T* yi = labels + i * c;
    const T* zi = preout + i * c;
    T log_norm = 0;  // softmax: log(sum(exp(z))) computed around the row maximum
    if (softmax) {
      const T peak = *std::max_element(zi, zi + c);
      T sum = 0;
      for (std::int64_t j = 0; j < c; ++j) sum += std::exp(zi[j] - peak);
      log_norm = peak + std::log(sum);
    }
    T score = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      T term;
      if (softmax) {
        term = -yi[j] * std::max(zi[j] - log_norm, T(std::log(kEps)));
      } else if (sigmoid) {
        term = -(yi[j] * log_sigmoid(zi[j]) + (T(1) - yi[j]) * log_sigmoid(-zi[j]));
      } else {
        term = loss_term(spec.loss, yi[j], p[i * c + j], c);
      }
      score += mask_weight(mask, layout, i, j, c) * term;
    }
    scores[i] = score;
  }
}

template <typename T>
void loss_gradient(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                   T* grad, std::int64_t n, std::int64_t c) {
  const std::vector<T> p = probabilities(spec, preout, n, c);
  const bool softmax = fused_softmax(spec), sigmoid = fused_sigmoid(spec);
  if (!softmax && !sigmoid) {
    const T* pp = p.data();
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMin)
    for (std::int64_t e = 0; e < n * c; ++e) grad[e] = loss_term_grad(spec.loss, labels[e], pp[e], c);
    activation_backward(spec.activation, spec.alpha, preout, p.data(), grad, grad, n, c);
  }
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const T* yi = labels + i * c;
    const T* pi = p.data() + i * c;
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

#define SPARKGRAD_LOSS(T)                                                                                \
  template void loss_score<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, \
                              std::int64_t);                                                             \
  template void loss_gradient<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, \
                                 std::int64_t);
SPARKGRAD_LOSS(float)
SPARKGRAD_LOSS(double)

}  // namespace sparkgrad::nn
