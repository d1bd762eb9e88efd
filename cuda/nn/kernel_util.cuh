// Private helpers of the CUDA nn and optim twins: grid-stride launches on the calling thread's stream
// (error checks, copies and owning buffers come from cuda/compress).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../compress/cuda_util.cuh"

namespace sparkgrad::detail::cuda {

using sparkgrad::compress::cuda::check_cuda;
using sparkgrad::compress::cuda::check_kernels;
using sparkgrad::compress::cuda::copy_to_device;
using sparkgrad::compress::cuda::copy_to_host;
using sparkgrad::compress::cuda::fill_zero;
using sparkgrad::compress::cuda::DeviceBuffer;
using sparkgrad::compress::cuda::grid_for;

constexpr int kThreads = 256;  // threads per block of the elementwise kernels
constexpr unsigned kMaxGrid = 65535u * 8u;  // grid-stride loops cover any n beyond this

// Blocks for n items, one per thread, capped (the kernels loop with a grid stride).
inline unsigned blocks_for(std::int64_t n) { return std::max(1u, std::min(grid_for(n, kThreads), kMaxGrid)); }

// First index of this thread and the grid stride, for `for (i = first(); i < n; i += stride())`.
__device__ inline std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(blockDim.x) * gridDim.x; }

// Sum of `value` over the block (blockDim.x == kThreads), returned to every thread.
template <typename A>
__device__ A block_sum(A value) {
  __shared__ A partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width >>= 1) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  const A total = partial[0];
  __syncthreads();  // the next call may overwrite partial[] only after every thread read the total
  return total;
}

// out[j] = sum of x[i, j, e] over i < n and e < inner for x: (n, c, inner), accumulated in double and
// rounded once, as the CPU does (bias gradients, LSTM/SimpleRnn db). Deterministic: blocks sum fixed
// chunks of images in a fixed order, and a second pass adds the chunks in order. (cuda/nn/bias.cu)
template <typename T>
void channel_sums(const char* op, const T* x, T* out, std::int64_t n, std::int64_t c, std::int64_t inner);

}  // namespace sparkgrad::detail::cuda
