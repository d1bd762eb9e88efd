// Device-side activations shared by the activation kernels and the recurrent layers' fused step kernels
// (cpp/src/nn/activation.cpp, lstm.cpp and simple_rnn.cpp compute the same functions on the CPU).
#pragma once

#include <cstdint>

#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda::device {

// Overflow-free logistic and log(1 + e^x), as on the CPU.
template <typename T>
__device__ T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + exp(-x));
  const T e = exp(x);
  return e / (T(1) + e);
}
template <typename T>
__device__ T softplus(T x) {
  return x > T(0) ? x + log1p(exp(-x)) : log1p(exp(x));
}

// f(x) of an elementwise kind (softmax works per row and has its own kernel).
template <typename T>
__device__ T forward_value(Activation kind, T alpha, T x) {
  switch (kind) {
    case Activation::Relu: return x > T(0) ? x : T(0);
    case Activation::LeakyRelu: return x > T(0) ? x : alpha * x;
    case Activation::Elu: return x > T(0) ? x : alpha * expm1(x);
    case Activation::Tanh: return tanh(x);
    case Activation::Sigmoid: return sigmoid(x);
    case Activation::Softplus: return softplus(x);
    case Activation::HardTanh: return fmin(T(1), fmax(T(-1), x));
    default: return x;  // Identity
  }
}

// f'(z) written in terms of y = f(z), as the CPU's act_grad_block: every elementwise kind allows it, so the
// recurrent backward passes keep only outputs.
template <typename T>
__device__ T grad_from_output(Activation kind, T alpha, T y) {
  switch (kind) {
    case Activation::Relu: return y > T(0) ? T(1) : T(0);
    case Activation::LeakyRelu: return y > T(0) ? T(1) : alpha;
    case Activation::Elu: return y > T(0) ? T(1) : y + alpha;
    case Activation::Tanh: return T(1) - y * y;
    case Activation::Sigmoid: return y * (T(1) - y);
    case Activation::Softplus: return -expm1(-y);
    case Activation::HardTanh: return (y > T(-1) && y < T(1)) ? T(1) : T(0);
    default: return T(1);  // Identity (softmax works per row: softmax_backward_row)
  }
}

// y = softmax(x) over one row of `cols` values, the row maximum subtracted first as on the CPU; y may be x.
template <typename T>
__device__ void softmax_row(const T* x, T* y, std::int64_t cols) {
  T peak = x[0];
  for (std::int64_t j = 1; j < cols; ++j) peak = fmax(peak, x[j]);
  T sum = 0;
  for (std::int64_t j = 0; j < cols; ++j) {
    y[j] = exp(x[j] - peak);
    sum += y[j];
  }
  const T inv = T(1) / sum;
  for (std::int64_t j = 0; j < cols; ++j) y[j] *= inv;
}

// dx = y * (dy - sum(dy * y)) over one row of softmax outputs y; dx may be dy.
template <typename T>
__device__ void softmax_backward_row(const T* y, const T* dy, T* dx, std::int64_t cols) {
  T dot = 0;
  for (std::int64_t j = 0; j < cols; ++j) dot += dy[j] * y[j];
  for (std::int64_t j = 0; j < cols; ++j) dx[j] = y[j] * (dy[j] - dot);
}

}  // namespace sparkgrad::nn::cuda::device
