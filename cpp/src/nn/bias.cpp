// Bias add and bias gradient over (n, c, inner) tensors.
#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

// x: (n, c, inner), b: (c).
template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner) {
#pragma omp parallel for collapse(2) schedule(static) if (n * c * inner >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < c; ++j) {
      T* row = x + (i * c + j) * inner;
      const T bj = b[j];
      for (std::int64_t e = 0; e < inner; ++e) row[e] += bj;
    }
  }
}

// dy: (n, c, inner), db: (c); accumulated in double per channel for accuracy.
template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner) {
#pragma omp parallel for schedule(static) if (n * c * inner >= detail::kParallelMin && c > 1)
  for (std::int64_t j = 0; j < c; ++j) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const T* row = dy + (i * c + j) * inner;
      for (std::int64_t e = 0; e < inner; ++e) sum += row[e];
    }
    db[j] = static_cast<T>(sum);
  }
}

#define SPARKGRAD_BIAS(T)                                                                     \
  template void bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t);        \
  template void bias_grad<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t);
SPARKGRAD_BIAS(float)
SPARKGRAD_BIAS(double)

}  // namespace sparkgrad::nn
