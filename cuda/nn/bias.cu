// CUDA twin of cpp/src/nn/bias.cpp: bias add over (n, c, inner) and the per-channel bias gradient.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// x: (n, c, inner), b: (c).
template <typename T>
__global__ void bias_add_kernel(T* x, const T* b, std::int64_t total, std::int64_t c, std::int64_t inner) {
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) x[e] += b[(e / inner) % c];
}

// One block per channel j: db[j] = sum of dy[:, j, :], accumulated in double as on the CPU.
template <typename T>
__global__ void bias_grad_kernel(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner) {
  const std::int64_t j = blockIdx.x;
  double sum = 0.0;
  for (std::int64_t e = threadIdx.x; e < n * inner; e += blockDim.x) sum += dy[((e / inner) * c + j) * inner + e % inner];
  sum = block_sum(sum);
  if (threadIdx.x == 0) db[j] = static_cast<T>(sum);
}

}  // namespace

template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner) {
  const std::int64_t total = n * c * inner;
  if (total == 0) return;
  bias_add_kernel<<<blocks_for(total), kThreads, 0, gpu::current_stream()>>>(x, b, total, c, inner);
  check_kernels("bias_add");
}

template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner) {
  if (c == 0) return;
  bias_grad_kernel<<<static_cast<unsigned>(c), kThreads, 0, gpu::current_stream()>>>(dy, db, n, c, inner);
  check_kernels("bias_grad");
}

#define SPARKGRAD_BIAS(T)                                                                \
  template void bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t);   \
  template void bias_grad<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t);
SPARKGRAD_BIAS(float)
SPARKGRAD_BIAS(double)

}  // namespace sparkgrad::nn::cuda
