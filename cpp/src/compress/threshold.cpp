// Sparse threshold encoding in two passes: per-chunk counts + prefix sum, then ordered writes, so the
// output is ascending and identical for every thread count (chunks do not depend on the thread count).
#include <algorithm>
#include <type_traits>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

namespace {

// Elements per chunk: large enough to amortise scheduling, small enough to balance two threads.
constexpr std::int64_t kChunk = std::int64_t{1} << 15;

// |x| >= t on the bit pattern (see at_least): integer SIMD, false for NaN.
template <typename T>
class MagnitudeTest {
 public:
  using Bits = typename FloatBits<T>::U;
  explicit MagnitudeTest(T t) : low_(to_bits(t)) {}
  Bits operator()(const T* x) const {
    return at_least<Bits>(to_bits(*x) & ~FloatBits<T>::kSign, low_, FloatBits<T>::kInf);
  }

 private:
  Bits low_;
};

// Branch-free count of |x| >= t over [begin, end).
template <typename T>
std::int64_t count_range(const T* x, std::int64_t begin, std::int64_t end, const MagnitudeTest<T>& test) {
  typename MagnitudeTest<T>::Bits c = 0;
  for (std::int64_t i = begin; i < end; ++i) c += test(x + i);
  return static_cast<std::int64_t>(c);
}

// Emits the qualifying elements of [begin, end) to out[pos..stop) in ascending order; returns the
// position after the last entry written. Blocks of 16 are screened branch-free first because almost all
// of them are empty at the densities gradient sharing runs at.
template <typename T>
std::int64_t write_range(T* x, std::int64_t begin, std::int64_t end, T t, const MagnitudeTest<T>& test,
                         std::int32_t* out, std::int64_t pos, std::int64_t stop) {
  for (std::int64_t i = begin; i < end && pos < stop; i += 16) {
    const std::int64_t block_end = std::min(end, i + 16);
    if (block_end - i == 16) {
      typename MagnitudeTest<T>::Bits any = 0;
      for (int j = 0; j < 16; ++j) any |= test(x + i + j);
      if (any == 0) continue;
    }
    // Branch-free within a non-empty block (its cache line is written anyway): entries that do not
    // qualify, or lie past `stop`, go to a scratch word and leave x unchanged.
    std::int32_t scratch;
    for (std::int64_t e = i; e < block_end; ++e) {
      const T v = x[e];
      const bool open = pos < stop;
      const bool take = test(x + e) && open;
      T moved = v;
      const std::int32_t entry = sparse_entry(moved, t, e);
      *(open ? out + pos : &scratch) = entry;
      x[e] = take ? moved : v;
      pos += take;
    }
  }
  return pos;
}

}  // namespace

template <typename T>
SparsePlan threshold_plan(const T* x, std::int64_t n, double threshold, std::int64_t boundary) {
  check_encode_args("threshold_encode", n, threshold);
  SparsePlan plan;
  plan.n = n;
  plan.threshold = static_cast<float>(threshold);
  plan.chunk = kChunk;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  plan.offsets.assign(static_cast<std::size_t>(chunks) + 1, 0);
  const MagnitudeTest<T> test(static_cast<T>(plan.threshold));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    plan.offsets[c + 1] = count_range(x, c * kChunk, std::min(n, (c + 1) * kChunk), test);
  }
  for (std::int64_t c = 0; c < chunks; ++c) plan.offsets[c + 1] += plan.offsets[c];
  plan.count = plan.offsets[chunks];
  plan.entries = boundary < 0 ? plan.count : std::min(plan.count, boundary);
  return plan;
}

template <typename T>
void threshold_encode(T* x, const SparsePlan& plan, std::int32_t* out) {
  out[0] = static_cast<std::int32_t>(plan.entries);
  out[1] = static_cast<std::int32_t>(plan.n);
  out[2] = threshold_bits(plan.threshold);
  out[3] = kFlagSparse;
  std::int32_t* payload = out + kHeaderWords;
  const T t = static_cast<T>(plan.threshold);
  const MagnitudeTest<T> test(t);
  const auto chunks = static_cast<std::int64_t>(plan.offsets.size()) - 1;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t pos = plan.offsets[c];
    const std::int64_t stop = std::min(plan.offsets[c + 1], plan.entries);
    if (pos >= stop) continue;
    const std::int64_t end = write_range(x, c * plan.chunk, std::min(plan.n, (c + 1) * plan.chunk), t, test,
                                         payload, pos, stop);
    if (end != stop) {
      guard.capture([] { throw_runtime("threshold_encode", "residual changed between counting and encoding"); });
    }
  }
  guard.rethrow();
}

template SparsePlan threshold_plan<float>(const float*, std::int64_t, double, std::int64_t);
template SparsePlan threshold_plan<double>(const double*, std::int64_t, double, std::int64_t);
template void threshold_encode<float>(float*, const SparsePlan&, std::int32_t*);
template void threshold_encode<double>(double*, const SparsePlan&, std::int32_t*);

}  // namespace sparkgrad::compress
