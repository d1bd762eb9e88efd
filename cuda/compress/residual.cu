// CUDA twin of cpp/src/compress/residual.cpp: grid-stride elementwise kernels.
#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;
constexpr unsigned kMaxGrid = 65535;

unsigned grid(std::int64_t n) {
  const unsigned g = grid_for(n, kBlock);
  return g < kMaxGrid ? (g > 0 ? g : 1) : kMaxGrid;
}

// residual: (n,) += update: (n,).
template <typename T>
__global__ void accumulate_kernel(T* residual, const T* update, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    residual[i] += update[i];
  }
}

// residual: (n,) clipped to [-limit, limit]; NaN stays NaN.
template <typename T>
__global__ void clip_kernel(T* residual, std::int64_t n, T limit) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T v = residual[i];
    residual[i] = v > limit ? limit : (v < -limit ? -limit : v);
  }
}

}  // namespace

template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n) {
  accumulate_kernel<<<grid(n), kBlock, 0, gpu::current_stream()>>>(residual, update, n);
  check_kernels("accumulate");
}

template <typename T>
void clip(T* residual, std::int64_t n, T limit) {
  clip_kernel<<<grid(n), kBlock, 0, gpu::current_stream()>>>(residual, n, limit);
  check_kernels("clip");
}

template void accumulate<float>(float*, const float*, std::int64_t);
template void accumulate<double>(double*, const double*, std::int64_t);
template void clip<float>(float*, std::int64_t, float);
template void clip<double>(double*, std::int64_t, double);

}  // namespace sparkgrad::compress::cuda
