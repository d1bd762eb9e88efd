// Bias add and bias gradient over (n, c, inner) tensors.
#include <algorithm>
#include <vector>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

// x: (n, c, inner), b: (c).
template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner) {
  if (inner == 1) {  // a dense layer's (n, c): one vector pass per row, not c loops of one element
#pragma omp parallel for schedule(static) if (n * c >= detail::kParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = x + i * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) row[j] += b[j];
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (n * c * inner >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < c; ++j) {
      T* row = x + (i * c + j) * inner;
      const T bj = b[j];
      for (std::int64_t e = 0; e < inner; ++e) row[e] += bj;
    }
  }
}

namespace {

// Adds rows [first, last) of dy (n, c, inner) into sums (c), in double. Memory is read in order: for
// inner == 1 (dense layers) each row of c values is added across the sums, otherwise each contiguous
// (i, j) plane is reduced with several partial sums (a single running sum would stall on add latency).
template <typename T>
void add_rows(const T* dy, double* sums, std::int64_t first, std::int64_t last, std::int64_t c,
              std::int64_t inner) {
  for (std::int64_t i = first; i < last; ++i) {
    const T* row = dy + i * c * inner;
    if (inner == 1) {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) sums[j] += static_cast<double>(row[j]);
      continue;
    }
    for (std::int64_t j = 0; j < c; ++j, row += inner) {
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (std::int64_t e = 0; e < inner; ++e) sum += static_cast<double>(row[e]);
      sums[j] += sum;
    }
  }
}

}  // namespace

// dy: (n, c, inner), db: (c); accumulated in double. Rows are split into a fixed number of blocks whose
// partial sums are added in block order, so the result does not depend on the thread count.
template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner) {
  constexpr std::int64_t kBlocks = 8;
  const std::int64_t blocks = n * c * inner >= detail::kParallelMin ? std::min(n, kBlocks) : 1;
  std::vector<double> partial(static_cast<std::size_t>(blocks * c), 0.0);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (std::int64_t block = 0; block < blocks; ++block) {
    add_rows(dy, partial.data() + block * c, n * block / blocks, n * (block + 1) / blocks, c, inner);
  }
  for (std::int64_t j = 0; j < c; ++j) {
    double sum = 0.0;
    for (std::int64_t block = 0; block < blocks; ++block) sum += partial[block * c + j];
    db[j] = static_cast<T>(sum);
  }
}

#define SPARKGRAD_BIAS(T)                                                                     \
  template void bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t);        \
  template void bias_grad<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t);
SPARKGRAD_BIAS(float)
SPARKGRAD_BIAS(double)

}  // namespace sparkgrad::nn
