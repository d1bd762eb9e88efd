// Device-side values of the elementwise activations, shared by the activation kernels and the LSTM's fused
// gate kernels (cpp/src/nn/activation.cpp and lstm.cpp compute the same functions on the CPU).
#pragma once

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

}  // namespace sparkgrad::nn::cuda::device
