// Private helpers shared by the nn and optim CPU kernels.
#pragma once

#include <cstdint>

// The library is built for the baseline ISA (no -march), so the hot elementwise and small-block kernels
// (recurrent steps, Winograd convolution blocks) are compiled three times, for AVX-512 (x86-64-v4), AVX2 + FMA (v3) and the baseline, and the loader picks the
// widest the CPU has (GCC target_clones, an ifunc). The helpers they call are forced inline so that
// their loops get the clone's instructions. Other compilers and targets get the portable build.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPARKGRAD_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPARKGRAD_SIMD_CLONES
#endif
#if defined(__GNUC__)
#define SPARKGRAD_FORCE_INLINE inline __attribute__((always_inline))
#else
#define SPARKGRAD_FORCE_INLINE inline
#endif

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
