// Activation functions forward and backward; softmax works per row of a (rows, cols) array.
#include <algorithm>
#include <cmath>

#include "kernel_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

Activation parse_activation(const char* op, const std::string& name) {
  static const std::pair<const char*, Activation> kNames[] = {
      {"identity", Activation::Identity}, {"relu", Activation::Relu},         {"leakyrelu", Activation::LeakyRelu},
      {"elu", Activation::Elu},           {"tanh", Activation::Tanh},         {"sigmoid", Activation::Sigmoid},
      {"softmax", Activation::Softmax},   {"softplus", Activation::Softplus}, {"hardtanh", Activation::HardTanh},
  };
  for (const auto& [key, value] : kNames) {
    if (name == key) return value;
  }
  throw_invalid(op, "unknown activation '", name,
                "', expected one of identity relu leakyrelu elu tanh sigmoid softmax softplus hardtanh");
}

using detail::for_each_index;

namespace {

// Overflow-free logistic and log(1 + e^x).
template <typename T>
T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}
template <typename T>
T softplus(T x) {
  return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// x, y: (rows, cols); y[i] = softmax(x[i]) with the row maximum subtracted first.
template <typename T>
void softmax_rows(const T* x, T* y, std::int64_t rows, std::int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= detail::kParallelMin)
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * cols;
    T* yi = y + i * cols;
    T peak = xi[0];
    for (std::int64_t j = 1; j < cols; ++j) peak = std::max(peak, xi[j]);
    T sum = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      yi[j] = std::exp(xi[j] - peak);
      sum += yi[j];
    }
    const T inv = T(1) / sum;
    for (std::int64_t j = 0; j < cols; ++j) yi[j] *= inv;
  }
}

}  // namespace

template <typename T>
void activation_forward(Activation kind, double alpha_in, const T* x, T* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  const T alpha = static_cast<T>(alpha_in);
  switch (kind) {
    case Activation::Identity:
      if (x != y) for_each_index(n, [=](std::int64_t i) { y[i] = x[i]; });
      return;
    case Activation::Relu:
      return for_each_index(n, [=](std::int64_t i) { y[i] = x[i] > T(0) ? x[i] : T(0); });
    case Activation::LeakyRelu:
      return for_each_index(n, [=](std::int64_t i) { y[i] = x[i] > T(0) ? x[i] : alpha * x[i]; });
    case Activation::Elu:
      return for_each_index(n, [=](std::int64_t i) { y[i] = x[i] > T(0) ? x[i] : alpha * std::expm1(x[i]); });
    case Activation::Tanh:
      return for_each_index(n, [=](std::int64_t i) { y[i] = std::tanh(x[i]); });
    case Activation::Sigmoid:
      return for_each_index(n, [=](std::int64_t i) { y[i] = sigmoid(x[i]); });
    case Activation::Softmax:
      return softmax_rows(x, y, rows, cols);
    case Activation::Softplus:
      return for_each_index(n, [=](std::int64_t i) { y[i] = softplus(x[i]); });
    case Activation::HardTanh:
      return for_each_index(n, [=](std::int64_t i) { y[i] = std::min(T(1), std::max(T(-1), x[i])); });
  }
}

template <typename T>
void activation_backward(Activation kind, double alpha_in, const T* x, const T* y, const T* dy, T* dx,
                         std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  const T alpha = static_cast<T>(alpha_in);
  switch (kind) {
    case Activation::Identity:
      if (dx != dy) for_each_index(n, [=](std::int64_t i) { dx[i] = dy[i]; });
      return;
    case Activation::Relu:
      // dy is read unconditionally: a conditional load keeps the select from vectorizing and leaves a
      // branch that random signs mispredict half the time (15x slower).
      return for_each_index(n, [=](std::int64_t i) {
        const T g = dy[i];
        dx[i] = x[i] > T(0) ? g : T(0);
      });
    case Activation::LeakyRelu:
      return for_each_index(n, [=](std::int64_t i) { dx[i] = x[i] > T(0) ? dy[i] : alpha * dy[i]; });
    case Activation::Elu:
      return for_each_index(n, [=](std::int64_t i) { dx[i] = x[i] > T(0) ? dy[i] : (y[i] + alpha) * dy[i]; });
    case Activation::Tanh:
      return for_each_index(n, [=](std::int64_t i) { dx[i] = (T(1) - y[i] * y[i]) * dy[i]; });
    case Activation::Sigmoid:
      return for_each_index(n, [=](std::int64_t i) { dx[i] = y[i] * (T(1) - y[i]) * dy[i]; });
    case Activation::Softplus:
      return for_each_index(n, [=](std::int64_t i) { dx[i] = sigmoid(x[i]) * dy[i]; });
    case Activation::HardTanh:
      return for_each_index(n, [=](std::int64_t i) {
        const T g = dy[i];
        dx[i] = (x[i] > T(-1) && x[i] < T(1)) ? g : T(0);
      });
    case Activation::Softmax:
      // dx = y * (dy - sum(dy * y)) per row.
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
      for (std::int64_t i = 0; i < rows; ++i) {
        const T* yi = y + i * cols;
        const T* dyi = dy + i * cols;
        T* dxi = dx + i * cols;
        T dot = 0;
        for (std::int64_t j = 0; j < cols; ++j) dot += dyi[j] * yi[j];
        for (std::int64_t j = 0; j < cols; ++j) dxi[j] = yi[j] * (dyi[j] - dot);
      }
      return;
  }
}

#define SPARKGRAD_ACTIVATION(T)                                                                              \
  template void activation_forward<T>(Activation, double, const T*, T*, std::int64_t, std::int64_t);      \
  template void activation_backward<T>(Activation, double, const T*, const T*, const T*, T*, std::int64_t, \
                                       std::int64_t);
SPARKGRAD_ACTIVATION(float)
SPARKGRAD_ACTIVATION(double)

}  // namespace sparkgrad::nn
