// Residual vector work of the encoding handler: accumulating updates and clipping.
#include <algorithm>

#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) residual[i] += update[i];
}

template <typename T>
void clip(T* residual, std::int64_t n, T limit) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) residual[i] = std::min(std::max(residual[i], -limit), limit);
}

template void accumulate<float>(float*, const float*, std::int64_t);
template void accumulate<double>(double*, const double*, std::int64_t);
template void clip<float>(float*, std::int64_t, float);
template void clip<double>(double*, std::int64_t, double);

}  // namespace sparkgrad::compress
