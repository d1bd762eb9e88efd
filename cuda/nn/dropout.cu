// CUDA twin of cpp/src/nn/dropout.cpp. The draw of element i is the same splitmix64 output of (seed, i)
// in integer arithmetic, converted exactly to a double in [0, 1): masks are bit-identical to the CPU's.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

__device__ double uniform_at(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// x, y, mask: (size).
template <typename T>
__global__ void dropout_forward_kernel(const T* x, T* y, T* mask, std::int64_t size, double retain, T keep,
                                       std::uint64_t seed) {
  for (std::int64_t i = first_index(); i < size; i += grid_stride()) {
    const T m = uniform_at(seed, static_cast<std::uint64_t>(i)) < retain ? keep : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

template <typename T>
__global__ void dropout_backward_kernel(const T* dy, const T* mask, T* dx, std::int64_t size) {
  for (std::int64_t i = first_index(); i < size; i += grid_stride()) dx[i] = dy[i] * mask[i];
}

}  // namespace

template <typename T>
void dropout_forward(const T* x, T* y, T* mask, std::int64_t size, double retain, std::uint64_t seed) {
  if (size == 0) return;
  dropout_forward_kernel<<<blocks_for(size), kThreads, 0, gpu::current_stream()>>>(x, y, mask, size, retain, static_cast<T>(1.0 / retain),
                                                          seed);
  check_kernels("dropout_forward");
}

template <typename T>
void dropout_backward(const T* dy, const T* mask, T* dx, std::int64_t size) {
  if (size == 0) return;
  dropout_backward_kernel<<<blocks_for(size), kThreads, 0, gpu::current_stream()>>>(dy, mask, dx, size);
  check_kernels("dropout_backward");
}

#define SPARKGRAD_DROPOUT(T)                                                                     \
  template void dropout_forward<T>(const T*, T*, T*, std::int64_t, double, std::uint64_t); \
  template void dropout_backward<T>(const T*, const T*, T*, std::int64_t);
SPARKGRAD_DROPOUT(float)
SPARKGRAD_DROPOUT(double)

}  // namespace sparkgrad::nn::cuda
