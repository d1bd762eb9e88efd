// Residual vector work of the encoding handler: accumulating updates and clipping.
#include <algorithm>
#include <vector>

#include "sparkgrad/compress.h"
#include "block16.h"

namespace sparkgrad::compress {

template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n, T scale) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) residual[i] += scale * update[i];
}

template <typename T>
void accumulate_at(const char* op, T* residual, const T* update, std::int64_t n, T scale, const std::int64_t* at,
                   std::int64_t count) {
  check_at_indices(op, at, count, n);
  // serial: a step's support is a few thousand indices in runs (rows of a table), its cost the cache misses.
  // All sums are read before any is written, as NumPy's residual[at] += ... does: a repeated index adds once.
  std::vector<T> sums(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) sums[k] = residual[at[k]] + scale * update[at[k]];
  for (std::int64_t k = 0; k < count; ++k) residual[at[k]] = sums[k];
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

template void accumulate<float>(float*, const float*, std::int64_t, float);
template void accumulate<double>(double*, const double*, std::int64_t, double);
template void accumulate_at<float>(const char*, float*, const float*, std::int64_t, float, const std::int64_t*,
                                   std::int64_t);
template void accumulate_at<double>(const char*, double*, const double*, std::int64_t, double, const std::int64_t*,
                                    std::int64_t);
template void clip<float>(float*, std::int64_t, float);
template void clip<double>(double*, std::int64_t, double);
template void clip_bounded<float>(float*, std::int64_t, float, float*);
template void clip_bounded<double>(double*, std::int64_t, double, double*);

}  // namespace sparkgrad::compress
