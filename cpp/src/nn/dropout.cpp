// Inverted dropout with a counter-based generator: element i's draw depends only on (seed, i), so the
// mask is identical for any thread count and any split of the loop.
#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// The i-th output of a splitmix64 stream started at `seed`, as a uniform double in [0, 1).
double uniform_at(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

// x, y, mask: (size).
template <typename T>
void dropout_forward(const T* x, T* y, T* mask, std::int64_t size, double retain, std::uint64_t seed) {
  const T keep_value = static_cast<T>(1.0 / retain);
  detail::for_each_index(size, [=](std::int64_t i) {
    const T m = uniform_at(seed, static_cast<std::uint64_t>(i)) < retain ? keep_value : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  });
}

// dy, mask, dx: (size).
template <typename T>
void dropout_backward(const T* dy, const T* mask, T* dx, std::int64_t size) {
  detail::for_each_index(size, [=](std::int64_t i) { dx[i] = dy[i] * mask[i]; });
}

#define SPARKGRAD_DROPOUT(T)                                                                     \
  template void dropout_forward<T>(const T*, T*, T*, std::int64_t, double, std::uint64_t); \
  template void dropout_backward<T>(const T*, const T*, T*, std::int64_t);
SPARKGRAD_DROPOUT(float)
SPARKGRAD_DROPOUT(double)

}  // namespace sparkgrad::nn
