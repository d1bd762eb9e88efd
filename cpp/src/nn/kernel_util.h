// Private helpers shared by the nn and optim CPU kernels.
#pragma once

#include <cstdint>

namespace sparkgrad::detail {

// Elementwise loops below this many values run on one thread: forking costs more than it saves.
constexpr std::int64_t kParallelMin = 1 << 15;

// fn(i) for i in [0, n), statically split over the OpenMP threads when n is large enough. Each thread
// calls a private copy of fn: stores through the kernel's array pointers then provably cannot alias the
// captured scalars, so they stay in registers and the loop vectorizes.
template <typename Fn>
void for_each_index(std::int64_t n, const Fn& fn) {
#pragma omp parallel if (n >= kParallelMin)
  {
    const Fn local = fn;
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) local(i);
  }
}

}  // namespace sparkgrad::detail
