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

// Largest magnitude bit pattern of the non-NaN elements of [begin, end) of x, as a T: the block's exact
// bound (branch-free, so it vectorises).
template <typename T>
T block_max(const T* x, std::int64_t begin, std::int64_t end) {
  using U = typename FloatBits<T>::U;
  U m = 0;
  for (std::int64_t i = begin; i < end; ++i) {
    const U a = to_bits(x[i]) & ~FloatBits<T>::kSign;
    const U finite_or_inf = a <= FloatBits<T>::kInf ? a : U{0};
    m = finite_or_inf > m ? finite_or_inf : m;
  }
  return from_bits<T>(m);
}

// The counting pass over chunks (threshold_plan's layout) with record(c, tb, rec) recording the
// qualifying indices of chunk c.
template <typename T, typename Record>
SparsePlan plan_chunks(std::int64_t n, double threshold, std::int64_t boundary, Record record) {
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
    plan.offsets[c + 1] = record(c, tb, &plan.indices[c * kRecordStride]);
  }
  for (std::int64_t c = 0; c < chunks; ++c) plan.offsets[c + 1] += plan.offsets[c];
  plan.count = plan.offsets[chunks];
  plan.entries = boundary < 0 ? plan.count : std::min(plan.count, boundary);
  return plan;
}

}  // namespace

template <typename T>
SparsePlan threshold_plan(const T* x, std::int64_t n, double threshold, std::int64_t boundary) {
  return plan_chunks<T>(n, threshold, boundary, [&](std::int64_t c, auto tb, std::int32_t* rec) {
    return record_range(x, c * kChunk, std::min(n, (c + 1) * kChunk), tb, rec);
  });
}

// kChunk is a multiple of a bound group's elements, so every group lies in one chunk and each chunk's thread
// owns the bounds of its groups and their blocks.
static_assert(kChunk % (kBoundBlock * kBoundGroup) == 0);
constexpr std::int64_t kChunkGroups = kChunk / (kBoundBlock * kBoundGroup);

namespace {

// Calls read(b) for each block b of chunk c whose bound reaches the threshold (bit pattern tb), ascending.
template <typename T, typename Read>
void for_each_bounded_block(std::int64_t n, std::int64_t c, T* bounds, const T* x, typename FloatBits<T>::U tb,
                            Read read) {
  detail::for_each_bounded_block(n, c * kChunkGroups, std::min(bound_groups(n), (c + 1) * kChunkGroups), bounds,
                                 x, tb, read);
}

// The record of the qualifying elements of block b: a block's worth plus the lanes record_range may write
// past its last entry.
struct BlockRecord {
  std::int32_t at[kBoundBlock + 8];
  std::int64_t count;
};

template <typename T>
BlockRecord record_block(const T* x, std::int64_t n, std::int64_t b, typename FloatBits<T>::U tb) {
  BlockRecord r;
  const std::int64_t begin = b * kBoundBlock;
  r.count = record_range(x, begin, std::min(n, begin + kBoundBlock), tb, r.at);
  return r;
}

}  // namespace

// Two passes over the qualifying blocks only, so that the record area is allocated for the entries found
// rather than a stride per chunk: a step that touched a few rows of a large table would otherwise fault in
// a fresh page of that area for every chunk holding an entry, which cost more than the count itself.
template <typename T>
SparsePlan threshold_plan_bounded(const T* x, std::int64_t n, double threshold, std::int64_t boundary,
                                  T* bounds) {
  check_encode_args("threshold_encode", n, threshold);
  SparsePlan plan;
  plan.n = n;
  plan.threshold = static_cast<float>(threshold);
  plan.chunk = kChunk;
  plan.packed = true;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  plan.offsets.assign(static_cast<std::size_t>(chunks) + 1, 0);
  const auto tb = to_bits(static_cast<T>(plan.threshold));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::int64_t found = 0;
    for_each_bounded_block(n, c, bounds, x, tb, [&](std::int64_t b) {
      const std::int64_t count = record_block(x, n, b, tb).count;
      // a bound left high by a post-processor's clipping (or by anything that only shrank the block) is
      // made exact, so the block is not read again until something reaches the threshold there
      if (count == 0) bounds[b] = block_max(x, b * kBoundBlock, std::min(n, (b + 1) * kBoundBlock));
      found += count;
    });
    plan.offsets[c + 1] = found;
  }
  for (std::int64_t c = 0; c < chunks; ++c) plan.offsets[c + 1] += plan.offsets[c];
  plan.count = plan.offsets[chunks];
  plan.entries = boundary < 0 ? plan.count : std::min(plan.count, boundary);
  plan.indices.reset(new std::int32_t[static_cast<std::size_t>(plan.count)]);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    if (plan.offsets[c + 1] == plan.offsets[c]) continue;
    std::int32_t* out = &plan.indices[plan.offsets[c]];
    // the blocks whose elements qualified before (every other one now has its exact bound, below it)
    for_each_bounded_block(n, c, bounds, x, tb, [&](std::int64_t b) {
      const BlockRecord r = record_block(x, n, b, tb);
      std::copy(r.at, r.at + r.count, out);
      out += r.count;
    });
  }
  return plan;
}

template <typename T>
void block_bounds(const T* x, std::int64_t n, T* bounds) {
  const std::int64_t blocks = bound_blocks(n);
#pragma omp parallel for schedule(static) if (blocks > 1024)
  for (std::int64_t b = 0; b < blocks; ++b) {
    bounds[b] = block_max(x, b * kBoundBlock, std::min(n, (b + 1) * kBoundBlock));
  }
  const std::int64_t groups = bound_groups(n);
  for (std::int64_t g = 0; g < groups; ++g) detail::tighten_group(bounds, blocks, g);
}

template <typename T>
void block_bounds_at(const char* op, const T* x, std::int64_t n, T* bounds, const std::int64_t* at,
                     std::int64_t count) {
  check_at_indices(op, at, count, n);
  T* groups = bounds + bound_blocks(n);
  // serial: the indices of a step's support come in runs of one row or range, so consecutive repeats of a
  // block are skipped and the rest is a few thousand blocks
  std::int64_t previous = -1;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t b = at[k] / kBoundBlock;
    if (b == previous) continue;
    bounds[b] = block_max(x, b * kBoundBlock, std::min(n, (b + 1) * kBoundBlock));
    T& group = groups[b / kBoundGroup];
    group = std::max(group, bounds[b]);
    previous = b;
  }
}

namespace {

// The recorded indices of chunk c of a plan.
const std::int32_t* chunk_records(const SparsePlan& plan, std::int64_t c) {
  return &plan.indices[plan.packed ? plan.offsets[c] : c * kRecordStride];
}

}  // namespace

template <typename T>
void block_bounds_encoded(const T* x, const SparsePlan& plan, T* bounds) {
  const auto chunks = static_cast<std::int64_t>(plan.offsets.size()) - 1;
  const std::int64_t blocks = bound_blocks(plan.n);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t pos = plan.offsets[c];
    const std::int64_t stop = std::min(plan.offsets[c + 1], plan.entries);
    const std::int32_t* rec = chunk_records(plan, c);
    std::int64_t previous = -1, previous_group = -1;
    for (std::int64_t k = pos; k < stop; ++k) {  // ascending within a chunk: each block once
      const std::int64_t b = rec[k - pos] / kBoundBlock;
      if (b == previous) continue;
      bounds[b] = block_max(x, b * kBoundBlock, std::min(plan.n, (b + 1) * kBoundBlock));
      previous = b;
      // a group's bound, left at what its blocks held before the encode, is lowered with them: else the
      // next count reads the group again although nothing in it reaches the threshold
      if (b / kBoundGroup != previous_group) {
        if (previous_group >= 0) detail::tighten_group(bounds, blocks, previous_group);
        previous_group = b / kBoundGroup;
      }
    }
    if (previous_group >= 0) detail::tighten_group(bounds, blocks, previous_group);
  }
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
    const std::int32_t* rec = chunk_records(plan, c);
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
template SparsePlan threshold_plan_bounded<float>(const float*, std::int64_t, double, std::int64_t, float*);
template SparsePlan threshold_plan_bounded<double>(const double*, std::int64_t, double, std::int64_t, double*);
template void block_bounds<float>(const float*, std::int64_t, float*);
template void block_bounds<double>(const double*, std::int64_t, double*);
template void block_bounds_at<float>(const char*, const float*, std::int64_t, float*, const std::int64_t*,
                                     std::int64_t);
template void block_bounds_at<double>(const char*, const double*, std::int64_t, double*,
                                      const std::int64_t*, std::int64_t);
template void block_bounds_encoded<float>(const float*, const SparsePlan&, float*);
template void block_bounds_encoded<double>(const double*, const SparsePlan&, double*);

}  // namespace sparkgrad::compress
