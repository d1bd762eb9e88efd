// Private helpers shared by the nn and optim CPU kernels.
#pragma once

#include <cstdint>

namespace sparkgrad::detail {

// Elementwise loops below this many values run on one thread: forking costs more than it saves.
constexpr std::int64_t kParallelMin = 1 << 15;

// fn(i) for i in [0, n), statically split over the OpenMP threads when n is large enough.
template <typename Fn>
void for_each_index(std::int64_t n, Fn fn) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace sparkgrad::detail
