// Sparse threshold encoding in two passes: the counting pass reads x once and records the qualifying
// indices per chunk (+ prefix sum of the counts); the writing pass then touches only those elements, so x
// is streamed once. Output is ascending and identical for every thread count (chunks do not depend on
// the thread count).
#include <algorithm>
#include <type_traits>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"
#include "block16.h"

namespace sparkgrad::compress {

namespace {

// Elements per chunk: large enough to amortise scheduling, small enough to balance two threads.
constexpr std::int64_t kChunk = std::int64_t{1} << 15;
// Prefetch distance of the writing pass, in recorded entries.
constexpr std::int64_t kAhead = 16;

// Set-bit positions of every byte value, packed from lane 0 (compress-store emission): a byte of a mask
// is emitted by writing all 8 lanes and advancing by its popcount, so no branch depends on the data.
struct ByteLanes {
  std::uint8_t lane[256][8];
  std::uint8_t count[256];
};
constexpr ByteLanes make_byte_lanes() {
  ByteLanes t{};
  for (int b = 0; b < 256; ++b) {
    int k = 0;
    for (int j = 0; j < 8; ++j) {
      if ((b >> j) & 1) t.lane[b][k++] = static_cast<std::uint8_t>(j);
    }
    t.count[b] = static_cast<std::uint8_t>(k);
  }
  return t;
}
constexpr ByteLanes kByteLanes = make_byte_lanes();

// Ints reserved per chunk in SparsePlan::indices: emission may write up to 7 lanes past the last entry.
constexpr std::int64_t kRecordStride = kChunk + 8;

// Records (ascending) the indices of the elements of [begin, end) with |x| >= t (bit pattern tb) to rec;
// returns how many. Most 16-element masks are empty at gradient-sharing densities.
template <typename T>
std::int64_t record_range(const T* x, std::int64_t begin, std::int64_t end, typename FloatBits<T>::U tb,
                          std::int32_t* rec) {
  std::int32_t* w = rec;
  std::int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const std::uint32_t mask = detail::qualify_mask16(x + i, tb);
    if (mask == 0) continue;
    for (int q = 0; q < 2; ++q) {
      const std::uint32_t byte = (mask >> (8 * q)) & 0xffu;
      const auto base = static_cast<std::int32_t>(i + 8 * q);
      for (int j = 0; j < 8; ++j) w[j] = base + kByteLanes.lane[byte][j];
      w += kByteLanes.count[byte];
    }
  }
  for (; i < end; ++i) {
    if (detail::qualifies(x[i], tb)) *w++ = static_cast<std::int32_t>(i);
  }
  return w - rec;
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
  // Chunk c records into indices[c * kRecordStride ...], left uninitialised so that only the pages
  // written to are ever touched.
  plan.indices.reset(new std::int32_t[static_cast<std::size_t>(chunks * kRecordStride)]);
  const auto tb = to_bits(static_cast<T>(plan.threshold));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    plan.offsets[c + 1] =
        record_range(x, c * kChunk, std::min(n, (c + 1) * kChunk), tb, &plan.indices[c * kRecordStride]);
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
  const auto tb = to_bits(t);
  const auto chunks = static_cast<std::int64_t>(plan.offsets.size()) - 1;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t pos = plan.offsets[c];
    const std::int64_t stop = std::min(plan.offsets[c + 1], plan.entries);
    const std::int32_t* rec = &plan.indices[c * kRecordStride];
    bool changed = false;
    for (std::int64_t k = pos; k < stop; ++k) {
      const std::int32_t i = rec[k - pos];
      // The recorded elements are scattered: fetch a few ahead so that their cache misses overlap.
      if (k + kAhead < stop) __builtin_prefetch(x + rec[k + kAhead - pos], 1);
      changed |= !detail::qualifies(x[i], tb);
      payload[k] = sparse_entry(x[i], t, i);
    }
    if (changed) {
      guard.capture(
          [] { throw_runtime("threshold_encode", "residual changed between counting and encoding"); });
    }
  }
  guard.rethrow();
}

template SparsePlan threshold_plan<float>(const float*, std::int64_t, double, std::int64_t);
template SparsePlan threshold_plan<double>(const double*, std::int64_t, double, std::int64_t);
template void threshold_encode<float>(float*, const SparsePlan&, std::int32_t*);
template void threshold_encode<double>(double*, const SparsePlan&, std::int32_t*);

}  // namespace sparkgrad::compress
