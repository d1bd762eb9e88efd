// CUDA twin of cpp/src/nn/activation.cpp: elementwise kinds one thread per value, softmax one thread per
// row (max-subtracted, as on the CPU).
#include "activation.cuh"
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;
using namespace sparkgrad::nn::cuda::device;

template <typename T>
__device__ T backward_value(Activation kind, T alpha, T x, T y, T dy) {
  switch (kind) {
    case Activation::Relu: return x > T(0) ? dy : T(0);
    case Activation::LeakyRelu: return x > T(0) ? dy : alpha * dy;
    case Activation::Elu: return x > T(0) ? dy : (y + alpha) * dy;
    case Activation::Tanh: return (T(1) - y * y) * dy;
    case Activation::Sigmoid: return y * (T(1) - y) * dy;
    case Activation::Softplus: return sigmoid(x) * dy;
    case Activation::HardTanh: return (x > T(-1) && x < T(1)) ? dy : T(0);
    default: return dy;  // Identity
  }
}

// x, y: (n) values.
template <typename T>
__global__ void forward_kernel(Activation kind, T alpha, const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = forward_value(kind, alpha, x[i]);
}

template <typename T>
__global__ void backward_kernel(Activation kind, T alpha, const T* x, const T* y, const T* dy, T* dx,
                                std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    dx[i] = backward_value(kind, alpha, x[i], y[i], dy[i]);
  }
}

// x, y: (rows, cols); y[i] = softmax(x[i]), one thread per row.
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = first_index(); i < rows; i += grid_stride()) softmax_row(x + i * cols, y + i * cols, cols);
}

// dx = y * (dy - sum(dy * y)) per row; dx may alias dy.
template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = first_index(); i < rows; i += grid_stride()) {
    softmax_backward_row(y + i * cols, dy + i * cols, dx + i * cols, cols);
  }
}

}  // namespace

template <typename T>
void activation_forward(Activation kind, double alpha, const T* x, T* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  if (n == 0 || (kind == Activation::Identity && x == y)) return;
  if (kind == Activation::Softmax) {
    softmax_kernel<<<blocks_for(rows), kThreads, 0, gpu::current_stream()>>>(x, y, rows, cols);
  } else {
    forward_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(kind, static_cast<T>(alpha), x, y, n);
  }
  check_kernels("activation_forward");
}

template <typename T>
void activation_backward(Activation kind, double alpha, const T* x, const T* y, const T* dy, T* dx,
                         std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  if (n == 0 || (kind == Activation::Identity && dx == dy)) return;
  if (kind == Activation::Softmax) {
    softmax_backward_kernel<<<blocks_for(rows), kThreads, 0, gpu::current_stream()>>>(y, dy, dx, rows, cols);
  } else {
    backward_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(kind, static_cast<T>(alpha), x, y, dy, dx, n);
  }
  check_kernels("activation_backward");
}

#define SPARKGRAD_ACTIVATION(T)                                                                              \
  template void activation_forward<T>(Activation, double, const T*, T*, std::int64_t, std::int64_t);      \
  template void activation_backward<T>(Activation, double, const T*, const T*, const T*, T*, std::int64_t, \
                                       std::int64_t);
SPARKGRAD_ACTIVATION(float)
SPARKGRAD_ACTIVATION(double)

}  // namespace sparkgrad::nn::cuda
