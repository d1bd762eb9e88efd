// Residual vector work of the encoding handler: accumulating updates and clipping.
#include <algorithm>

#include "sparkgrad/compress.h"
#include "block16.h"

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

template <typename T>
void clip_bounded(T* residual, std::int64_t n, T limit, T* bounds) {
  // bounds per parallel unit: each unit owns its blocks, so the result does not depend on the threads
  constexpr std::int64_t kGroup = 2048;
  const std::int64_t blocks = bound_blocks(n);
  const std::int64_t groups = (blocks + kGroup - 1) / kGroup;
  const auto lb = to_bits(limit);
#pragma omp parallel for schedule(static) if (groups > 1)
  for (std::int64_t g = 0; g < groups; ++g) {
    const auto clip_block = [&](std::int64_t b) {
      const std::int64_t end = std::min(n, (b + 1) * kBoundBlock);
      for (std::int64_t i = b * kBoundBlock; i < end; ++i) {
        residual[i] = std::min(std::max(residual[i], -limit), limit);
      }
      bounds[b] = limit;  // it reached the limit: min(bound, limit)
    };
    const std::int64_t last = std::min(blocks, (g + 1) * kGroup);
    std::int64_t b = g * kGroup;
    // the bounds 16 at a time: after a row-sparse step most are far below the limit
    for (; b + 16 <= last; b += 16) {
      for (std::uint32_t mask = detail::qualify_mask16(bounds + b, lb); mask != 0; mask &= mask - 1) {
        clip_block(b + __builtin_ctz(mask));
      }
    }
    for (; b < last; ++b) {
      if (detail::qualifies(bounds[b], lb)) clip_block(b);
    }
  }
}

template void accumulate<float>(float*, const float*, std::int64_t);
template void accumulate<double>(double*, const double*, std::int64_t);
template void clip<float>(float*, std::int64_t, float);
template void clip<double>(double*, std::int64_t, double);
template void clip_bounded<float>(float*, std::int64_t, float, float*);
template void clip_bounded<double>(double*, std::int64_t, double, double*);

}  // namespace sparkgrad::compress
