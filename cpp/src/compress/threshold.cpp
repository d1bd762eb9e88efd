// Sparse threshold encoding in two passes: per-chunk counts + prefix sum, then ordered writes, so the
// output is ascending and identical for every thread count (chunks do not depend on the thread count).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

namespace {

// Elements per chunk: large enough to amortise scheduling, small enough to balance two threads.
constexpr std::int64_t kChunk = std::int64_t{1} << 15;

// Branch-free count of |x| >= t over [begin, end); the counter has the width of T so that the
// compare-and-add vectorises.
template <typename T>
std::int64_t count_range(const T* x, std::int64_t begin, std::int64_t end, T t) {
  using Counter = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  Counter c = 0;
  for (std::int64_t i = begin; i < end; ++i) c += static_cast<Counter>(std::abs(x[i]) >= t);
  return static_cast<std::int64_t>(c);
}

// Emits the qualifying elements of [begin, end) to out[pos..stop) in ascending order; returns the
// position after the last entry written. Blocks of 16 are screened with a branch-free mask first
// because almost all of them are empty at the densities gradient sharing runs at.
template <typename T>
std::int64_t write_range(T* x, std::int64_t begin, std::int64_t end, T t, std::int32_t* out,
                         std::int64_t pos, std::int64_t stop) {
  std::int64_t i = begin;
  for (; i + 16 <= end && pos < stop; i += 16) {
    std::uint32_t mask = 0;
    for (int j = 0; j < 16; ++j) mask |= static_cast<std::uint32_t>(std::abs(x[i + j]) >= t) << j;
    while (mask != 0 && pos < stop) {
      const std::int64_t e = i + __builtin_ctz(mask);
      mask &= mask - 1;
      const T v = x[e];
      const auto id = static_cast<std::int32_t>(e + 1);
      out[pos++] = v > 0 ? id : -id;
      x[e] = v > 0 ? v - t : v + t;
    }
  }
  for (; i < end && pos < stop; ++i) {
    const T v = x[i];
    if (std::abs(v) >= t) {
      const auto id = static_cast<std::int32_t>(i + 1);
      out[pos++] = v > 0 ? id : -id;
      x[i] = v > 0 ? v - t : v + t;
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
  const T t = static_cast<T>(plan.threshold);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    plan.offsets[c + 1] = count_range(x, c * kChunk, std::min(n, (c + 1) * kChunk), t);
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
  const auto chunks = static_cast<std::int64_t>(plan.offsets.size()) - 1;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t pos = plan.offsets[c];
    const std::int64_t stop = std::min(plan.offsets[c + 1], plan.entries);
    if (pos >= stop) continue;
    const std::int64_t end = write_range(x, c * plan.chunk, std::min(plan.n, (c + 1) * plan.chunk), t,
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
