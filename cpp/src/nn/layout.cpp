// Layout copies between a sequence's (N, T, C) and the (N, C, T) planes of the 2-D kernels. The float path
// transposes 8x8 blocks in vector registers (GCC vector shuffles, compiled per ISA): a strided element copy
// ran at about one element a cycle, and the 1-D convolution and pooling layers make four such copies of
// their input or output every step.
#include <algorithm>
#include <cstring>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// The elements [r0, r1) x [c0, c1) of one item: y[c, r] = x[r, c].
template <typename T>
SPARKGRAD_FORCE_INLINE void swap_tile(const T* x, T* y, std::int64_t rows, std::int64_t cols, std::int64_t r0,
                                      std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  for (std::int64_t c = c0; c < c1; ++c) {
    T* yc = y + c * rows;
    for (std::int64_t r = r0; r < r1; ++r) yc[r] = x[r * cols + c];
  }
}

// Square tiles of 16: both the rows read and the rows written stay in cache while a tile is copied.
constexpr std::int64_t kTile = 16;

template <typename T>
SPARKGRAD_FORCE_INLINE void swap_item_tiles(const T* x, T* y, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
      swap_tile(x, y, rows, cols, r0, std::min(rows, r0 + kTile), c0, std::min(cols, c0 + kTile));
    }
  }
}

typedef float Float8 __attribute__((vector_size(32)));

// The 8x8 block of x at (r0, c0) into y: three rounds of shuffles (pairs of elements, pairs of pairs,
// halves), after which register k holds column c0 + k.
SPARKGRAD_FORCE_INLINE void swap_block8(const float* x, float* y, std::int64_t rows, std::int64_t cols,
                                        std::int64_t r0, std::int64_t c0) {
  Float8 a[8], b[8], c[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&a[k], x + (r0 + k) * cols + c0, sizeof(Float8));
  for (int k = 0; k < 8; k += 2) {
    b[k] = __builtin_shufflevector(a[k], a[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    b[k + 1] = __builtin_shufflevector(a[k], a[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {
    c[k] = __builtin_shufflevector(b[k], b[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    c[k + 1] = __builtin_shufflevector(b[k], b[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    c[k + 2] = __builtin_shufflevector(b[k + 1], b[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    c[k + 3] = __builtin_shufflevector(b[k + 1], b[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int k = 0; k < 4; ++k) {
    const Float8 low = __builtin_shufflevector(c[k], c[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Float8 high = __builtin_shufflevector(c[k], c[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(y + (c0 + k) * rows + r0, &low, sizeof(Float8));
    std::memcpy(y + (c0 + k + 4) * rows + r0, &high, sizeof(Float8));
  }
}

SPARKGRAD_SIMD_CLONES void swap_item(const float* x, float* y, std::int64_t rows, std::int64_t cols) {
  std::int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    std::int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) swap_block8(x, y, rows, cols, r0, c0);
    swap_tile(x, y, rows, cols, r0, r0 + 8, c0, cols);
  }
  swap_tile(x, y, rows, cols, r0, rows, 0, cols);
}

SPARKGRAD_SIMD_CLONES void swap_item(const double* x, double* y, std::int64_t rows, std::int64_t cols) {
  swap_item_tiles(x, y, rows, cols);
}

}  // namespace

template <typename T>
void swap_last_axes(const T* x, T* y, std::int64_t n, std::int64_t rows, std::int64_t cols) {
  const std::int64_t size = rows * cols;
#pragma omp parallel for schedule(static) if (n > 1 && n * size >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) swap_item(x + i * size, y + i * size, rows, cols);
}

template void swap_last_axes<float>(const float*, float*, std::int64_t, std::int64_t, std::int64_t);
template void swap_last_axes<double>(const double*, double*, std::int64_t, std::int64_t, std::int64_t);

}  // namespace sparkgrad::nn
