// Private elementwise helpers of the recurrent kernels (lstm.cpp, gru.cpp, simple_rnn.cpp) and of
// attention.cpp's softmax: activations that vectorize, applied per row of a step. Internal linkage: every
// including file gets its own copy, compiled with that file's flags (all set -fno-trapping-math in
// cpp/CMakeLists.txt so the clamps vectorize).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {
namespace {

// A step's activations are a few transcendental calls per hidden unit: worth forking well below
// detail::kParallelMin.
constexpr std::int64_t kGateParallelMin = 1 << 12;

// Horner form of the Taylor polynomial 1 + r (1 + r/2 (1 + r/3 (...))) from term I up to K.
template <typename T, int I, int K>
SPARKGRAD_FORCE_INLINE T exp_taylor(T r) {
  if constexpr (I > K) {
    return T(1);
  } else {
    return T(1) + r * (T(1) / T(I)) * exp_taylor<T, I + 1, K>(r);
  }
}

// exp(x) with Cody-Waite reduction and a Taylor polynomial on |r| <= ln2/2 (7 terms: float, 13:
// double, each within an ulp or two); branch-free so the gate loops vectorize, which libm calls do not
// (with -fno-trapping-math, set for this file in cpp/CMakeLists.txt, the clamps become min/max).
template <typename T>
SPARKGRAD_FORCE_INLINE T exp_poly(T x) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  constexpr int kMantissa = sizeof(T) == 4 ? 23 : 52;
  constexpr Bits kBias = sizeof(T) == 4 ? 127 : 1023;
  constexpr T kMax = sizeof(T) == 4 ? T(87.0) : T(708.0);  // 2^k stays a normal number
  x = std::max(std::min(x, kMax), -kMax);
  // round to nearest by truncating x log2(e) +- 1/2: a plain conversion, unlike floor, vectorizes
  const Bits ki = static_cast<Bits>(x * T(1.4426950408889634) + std::copysign(T(0.5), x));
  const T k = static_cast<T>(ki);
  const T r = (x - k * T(0.693145751953125)) - k * T(1.428606820309417232e-06);
  const T p = exp_taylor<T, 1, sizeof(T) == 4 ? 7 : 13>(r);
  const Bits bits = (ki + kBias) << kMantissa;
  T scale;
  std::memcpy(&scale, &bits, sizeof(T));
  return p * scale;
}

// y[j] = f(z[j]) over one contiguous block; the switch sits outside the loops so each loop vectorizes.
template <typename T>
SPARKGRAD_FORCE_INLINE void act_block(Activation kind, T alpha, const T* z, T* y, std::int64_t len) {
  switch (kind) {
    case Activation::Relu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) y[j] = z[j] > T(0) ? z[j] : T(0);
      return;
    case Activation::LeakyRelu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) y[j] = z[j] > T(0) ? z[j] : alpha * z[j];
      return;
    case Activation::Elu:
      for (std::int64_t j = 0; j < len; ++j) y[j] = z[j] > T(0) ? z[j] : alpha * std::expm1(z[j]);
      return;
    case Activation::Tanh:  // 1 - 2 / (1 + e^{2z}): exact at +-inf, absolute error ~eps near 0
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) y[j] = T(1) - T(2) / (T(1) + exp_poly(T(2) * z[j]));
      return;
    case Activation::Sigmoid:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) y[j] = T(1) / (T(1) + exp_poly(-z[j]));
      return;
    case Activation::Softplus:
      for (std::int64_t j = 0; j < len; ++j) {
        y[j] = z[j] > T(0) ? z[j] + std::log1p(std::exp(-z[j])) : std::log1p(std::exp(z[j]));
      }
      return;
    case Activation::HardTanh:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) y[j] = std::min(T(1), std::max(T(-1), z[j]));
      return;
    default:  // identity (softmax is rejected by the binding)
      if (y != z) std::copy(z, z + len, y);
      return;
  }
}

// g[j] = f'(z[j]) written in terms of y = f(z): every elementwise kind allows it, so only outputs are kept.
template <typename T>
SPARKGRAD_FORCE_INLINE void act_grad_block(Activation kind, T alpha, const T* y, T* g, std::int64_t len) {
  switch (kind) {
    case Activation::Relu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = y[j] > T(0) ? T(1) : T(0);
      return;
    case Activation::LeakyRelu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = y[j] > T(0) ? T(1) : alpha;
      return;
    case Activation::Elu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = y[j] > T(0) ? T(1) : y[j] + alpha;
      return;
    case Activation::Tanh:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = T(1) - y[j] * y[j];
      return;
    case Activation::Sigmoid:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = y[j] * (T(1) - y[j]);
      return;
    case Activation::Softplus:
      for (std::int64_t j = 0; j < len; ++j) g[j] = -std::expm1(-y[j]);
      return;
    case Activation::HardTanh:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) g[j] = (y[j] > T(-1) && y[j] < T(1)) ? T(1) : T(0);
      return;
    default:
      std::fill(g, g + len, T(1));
      return;
  }
}

// d[j] *= f'(z[j]) written in terms of y = f(z), for the elementwise kinds: the backward of a step
// multiplies its incoming gradient in place, with no derivative buffer.
template <typename T>
SPARKGRAD_FORCE_INLINE void act_grad_mul(Activation kind, T alpha, const T* y, T* d, std::int64_t len) {
  switch (kind) {
    case Activation::Relu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] = y[j] > T(0) ? d[j] : T(0);
      return;
    case Activation::LeakyRelu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] = y[j] > T(0) ? d[j] : alpha * d[j];
      return;
    case Activation::Elu:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] = y[j] > T(0) ? d[j] : (y[j] + alpha) * d[j];
      return;
    case Activation::Tanh:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] *= T(1) - y[j] * y[j];
      return;
    case Activation::Sigmoid:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] *= y[j] * (T(1) - y[j]);
      return;
    case Activation::Softplus:
      for (std::int64_t j = 0; j < len; ++j) d[j] *= -std::expm1(-y[j]);
      return;
    case Activation::HardTanh:
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) d[j] = (y[j] > T(-1) && y[j] < T(1)) ? d[j] : T(0);
      return;
    default:  // identity
      return;
  }
}

// The state each step started from, h_prev (n, t, h): h0 (or zero) at step 0, then hs (n, t, h) shifted by
// a step; for the recurrent weights' gradient.
template <typename T>
void previous_states(const LstmShape& s, const T* hs, const T* h0, T* h_prev) {
  const std::int64_t h = s.h, ld = s.t * s.h;
  for (std::int64_t i = 0; i < s.n; ++i) {
    T* dst = h_prev + i * ld;
    if (h0 != nullptr) {
      std::copy(h0 + i * h, h0 + (i + 1) * h, dst);
    } else {
      std::fill(dst, dst + h, T(0));
    }
    std::copy(hs + i * ld, hs + (i + 1) * ld - h, dst + h);
  }
}

// [x_t | h_{t-1}] (n, t, c + h), with a trailing 1 per row (c + h + 1) when `ones`, for the parameter
// gradients [dW; dRW] (and db) in one product: each step's input next to the state it started from (h0 or
// zero at step 0).
template <typename T>
void previous_inputs_and_states(const LstmShape& s, const T* x, const T* hs, const T* h0, T* xh, bool ones) {
  const std::int64_t c = s.c, h = s.h, kx = s.c + s.h + (ones ? 1 : 0);
  for (std::int64_t i = 0; i < s.n; ++i) {
    for (std::int64_t t = 0; t < s.t; ++t) {
      const std::int64_t row = i * s.t + t;
      T* dst = xh + row * kx;
      std::copy(x + row * c, x + (row + 1) * c, dst);
      if (t > 0) {
        std::copy(hs + (row - 1) * h, hs + row * h, dst + c);
      } else if (h0 != nullptr) {
        std::copy(h0 + i * h, h0 + (i + 1) * h, dst + c);
      } else {
        std::fill(dst + c, dst + c + h, T(0));
      }
      if (ones) dst[c + h] = T(1);
    }
  }
}

// db (width) = column sums of dz (rows, width), accumulated row by row (contiguous) in double: the same
// for any thread count.
template <typename T>
void column_sums(const T* dz, std::int64_t rows, std::int64_t width, T* db) {
  std::vector<double> sum(static_cast<std::size_t>(width), 0.0);
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* d = dz + row * width;
    double* acc = sum.data();
#pragma omp simd
    for (std::int64_t j = 0; j < width; ++j) acc[j] += d[j];
  }
  for (std::int64_t j = 0; j < width; ++j) db[j] = static_cast<T>(sum[j]);
}

}  // namespace
}  // namespace sparkgrad::nn
