// CUDA twin of cpp/src/optim/regularization.cpp: L1/L2 gradient terms and decoupled weight decay.
#include "../nn/kernel_util.cuh"
#include "sparkgrad/optim.h"

namespace sparkgrad::optim::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// params, grad: (n); grad += l2 * w + l1 * sign(w).
template <typename T>
__global__ void regularize_kernel(const T* params, T* grad, std::int64_t n, T l1, T l2) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const T w = params[i];
    const T sign = w > T(0) ? T(1) : (w < T(0) ? T(-1) : T(0));
    grad[i] += l2 * w + l1 * sign;
  }
}

// params, update: (n); update += coeff * params.
template <typename T>
__global__ void weight_decay_kernel(const T* params, T* update, std::int64_t n, T coeff) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) update[i] += coeff * params[i];
}

}  // namespace

template <typename T>
void regularize_gradient(const T* params, T* grad, std::int64_t n, double l1, double l2) {
  if (n == 0) return;
  regularize_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(params, grad, n, static_cast<T>(l1), static_cast<T>(l2));
  check_kernels("regularize_gradient");
}

template <typename T>
void apply_weight_decay(const T* params, T* update, std::int64_t n, double coeff) {
  if (n == 0) return;
  weight_decay_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(params, update, n, static_cast<T>(coeff));
  check_kernels("apply_weight_decay");
}

#define SPARKGRAD_REGULARIZATION(T)                                                        \
  template void regularize_gradient<T>(const T*, T*, std::int64_t, double, double);      \
  template void apply_weight_decay<T>(const T*, T*, std::int64_t, double);
SPARKGRAD_REGULARIZATION(float)
SPARKGRAD_REGULARIZATION(double)

}  // namespace sparkgrad::optim::cuda
