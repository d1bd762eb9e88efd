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
  constexpr std::int64_t kAhead = 16;  // a step's rows lie scattered: their misses overlap when fetched early
  for (std::int64_t k = 0; k < count; ++k) {
    if (k + kAhead < count) {
      __builtin_prefetch(residual + at[k + kAhead], 1);
      __builtin_prefetch(update + at[k + kAhead]);
    }
    sums[k] = residual[at[k]] + scale * update[at[k]];
  }
  for (std::int64_t k = 0; k < count; ++k) residual[at[k]] = sums[k];
}

template <typename T>
void clip(T* residual, std::int64_t n, T limit) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) residual[i] = std::min(std::max(residual[i], -limit), limit);
}

template <typename T>
void clip_bounded(T* residual, std::int64_t n, T limit, T* bounds) {
  // bound groups per parallel unit (2048 blocks): each unit owns its groups and their blocks, so the result
  // does not depend on the threads
  constexpr std::int64_t kUnitGroups = 2048 / kBoundGroup;
  const std::int64_t groups = bound_groups(n);
  const std::int64_t units = (groups + kUnitGroups - 1) / kUnitGroups;
  const auto lb = to_bits(limit);
#pragma omp parallel for schedule(static) if (units > 1)
  for (std::int64_t u = 0; u < units; ++u) {
    const std::int64_t last = std::min(groups, (u + 1) * kUnitGroups);
    detail::for_each_bounded_block(n, u * kUnitGroups, last, bounds, residual, lb, [&](std::int64_t b) {
      const std::int64_t end = std::min(n, (b + 1) * kBoundBlock);
      for (std::int64_t i = b * kBoundBlock; i < end; ++i) {
        residual[i] = std::min(std::max(residual[i], -limit), limit);
      }
      bounds[b] = limit;  // it reached the limit: min(bound, limit)
    });
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
