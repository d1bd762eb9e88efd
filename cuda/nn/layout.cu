// CUDA twin of cpp/src/nn/layout.cpp: y (n, cols, rows) = x (n, rows, cols) with the last two axes
// swapped, through 32x32 tiles in shared memory so that both the reads and the writes are coalesced.
#include <algorithm>

#include "kernel_util.cuh"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // each thread copies kTile / kTileRows elements of a tile
constexpr unsigned kMaxItems = 65535u;  // gridDim.z; the kernel strides over the items beyond it

template <typename T>
__global__ void swap_last_axes_kernel(const T* x, T* y, std::int64_t n, std::int64_t rows, std::int64_t cols) {
  __shared__ T tile[kTile][kTile + 1];  // +1: the column reads fall in distinct banks
  const std::int64_t size = rows * cols;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kTile;
  for (std::int64_t item = blockIdx.z; item < n; item += gridDim.z) {
    const T* xi = x + item * size;
    T* yi = y + item * size;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const std::int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = xi[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const std::int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (r < rows && c < cols) yi[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is refilled for the next item
  }
}

}  // namespace

template <typename T>
void swap_last_axes(const T* x, T* y, std::int64_t n, std::int64_t rows, std::int64_t cols) {
  if (n == 0 || rows == 0 || cols == 0) return;
  if ((rows + kTile - 1) / kTile > 65535) {
    throw_invalid("swap_last_axes", "rows must be at most ", 65535 * kTile, " on a GPU, got ", rows);
  }
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile),
                  static_cast<unsigned>(std::min<std::int64_t>(n, kMaxItems)));
  swap_last_axes_kernel<T><<<grid, dim3(kTile, kTileRows), 0, gpu::current_stream()>>>(x, y, n, rows, cols);
  check_kernels("swap_last_axes");
}

template void swap_last_axes<float>(const float*, float*, std::int64_t, std::int64_t, std::int64_t);
template void swap_last_axes<double>(const double*, double*, std::int64_t, std::int64_t, std::int64_t);

}  // namespace sparkgrad::nn::cuda
