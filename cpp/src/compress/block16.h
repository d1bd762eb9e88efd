// 16-element block kernels shared by the sparse and bitmap encoders. The float32 versions use SSE2 (part of
// baseline x86-64, so wheels stay portable): a movemask turns 16 comparisons into a bit mask, which replaces
// a per-element scalar loop. Other types and targets use the portable scalar form; both compute exactly
// the per-element codes of compress.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sparkgrad/compress.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sparkgrad::compress::detail {

// |v| >= t for the bit pattern tb of t (false for NaN).
template <typename T>
inline bool qualifies(T v, typename FloatBits<T>::U tb) {
  return at_least(to_bits(v) & ~FloatBits<T>::kSign, tb, FloatBits<T>::kInf) != 0;
}

// Bit j set iff |x[j]| >= t (bit pattern tb of t), for j < 16.
template <typename T>
inline std::uint32_t qualify_mask16(const T* x, typename FloatBits<T>::U tb) {
  std::uint32_t mask = 0;
  for (int j = 0; j < 16; ++j) mask |= static_cast<std::uint32_t>(qualifies(x[j], tb)) << j;
  return mask;
}

// Bitmap word of x[0..16) (see bitmap_encode); moves x by what each code sends; count += encoded elements.
template <typename T>
inline std::uint32_t bitmap_word16(T* x, T t, T h, std::uint32_t& count) {
  std::uint32_t word = 0;
  for (int j = 0; j < 16; ++j) {
    const std::uint32_t code = bitmap_code(x[j], t, h);
    word |= ((code & 1u) << j) | ((code >> 1) << (j + 16));
    count += code != 0;
  }
  return word;
}

#if defined(__SSE2__)
// Set bits of v: baseline x86-64 has no popcnt instruction, and __builtin_popcount would be a libgcc call.
inline std::uint32_t bit_count(std::uint32_t v) {
  v -= (v >> 1) & 0x55555555u;
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return (((v + (v >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24;
}

// Magnitude bit patterns are non-negative int32, so at_least(a, m, inf) is m <= a <= inf in signed compares.
inline __m128i in_range(__m128i a, __m128i m, __m128i inf) {
  return _mm_andnot_si128(_mm_or_si128(_mm_cmplt_epi32(a, m), _mm_cmpgt_epi32(a, inf)), _mm_set1_epi32(-1));
}

inline int lane_mask(__m128i m) { return _mm_movemask_ps(_mm_castsi128_ps(m)); }

template <>
inline std::uint32_t qualify_mask16<float>(const float* x, std::uint32_t tb) {
  const __m128i abs = _mm_set1_epi32(0x7fffffff);
  const __m128i m = _mm_set1_epi32(static_cast<int>(tb));
  const __m128i inf = _mm_set1_epi32(static_cast<int>(FloatBits<float>::kInf));
  std::uint32_t mask = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128i a = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 * q)), abs);
    mask |= static_cast<std::uint32_t>(lane_mask(in_range(a, m, inf))) << (4 * q);
  }
  return mask;
}

template <>
inline std::uint32_t bitmap_word16<float>(float* x, float t, float h, std::uint32_t& count) {
  const __m128i sign = _mm_set1_epi32(static_cast<int>(FloatBits<float>::kSign));
  const __m128i inf = _mm_set1_epi32(static_cast<int>(FloatBits<float>::kInf));
  const __m128i tb = _mm_set1_epi32(static_cast<int>(to_bits(t)));
  const __m128i hb = _mm_set1_epi32(static_cast<int>(to_bits(h)));
  std::uint32_t value = 0, negative = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128 v = _mm_loadu_ps(x + 4 * q);
    const __m128i b = _mm_castps_si128(v);
    const __m128i s = _mm_and_si128(b, sign);
    const __m128i a = _mm_andnot_si128(sign, b);
    const __m128i full = in_range(a, tb, inf);
    const __m128i neg = _mm_and_si128(_mm_srai_epi32(b, 31), in_range(a, hb, inf));
    // Sent value as in bitmap_sent: +-t for full codes, -t/2 for half codes, +0 otherwise (exact).
    const __m128i sent = _mm_or_si128(_mm_and_si128(full, _mm_or_si128(tb, s)),
                                      _mm_and_si128(_mm_andnot_si128(full, neg), _mm_or_si128(hb, sign)));
    _mm_storeu_ps(x + 4 * q, _mm_sub_ps(v, _mm_castsi128_ps(sent)));
    value |= static_cast<std::uint32_t>(lane_mask(full)) << (4 * q);
    negative |= static_cast<std::uint32_t>(lane_mask(neg)) << (4 * q);
  }
  count += bit_count(value | negative);
  return value | (negative << 16);
}
#endif

// Group g's bound (bounds: the two levels of compress.h, `blocks` of them per block) set to the largest
// magnitude of its blocks' bounds (magnitudes' bit patterns order as they do; an integer max vectorises
// where a float one, for NaN's sake, does not).
template <typename T>
inline void tighten_group(T* bounds, std::int64_t blocks, std::int64_t g) {
  const std::int64_t first = g * kBoundGroup, last = std::min(blocks, first + kBoundGroup);
  typename FloatBits<T>::U m = 0;
  for (std::int64_t b = first; b < last; ++b) m = std::max(m, to_bits(bounds[b]) & ~FloatBits<T>::kSign);
  bounds[blocks + g] = from_bits<T>(m);
}

// Calls read(b), ascending, for each block b of the bound groups [g0, g1) whose bound reaches the threshold
// tb (bit pattern), reading the block bounds of only the groups whose own bound reaches it (bounds: the
// two levels of compress.h; x: the residual, whose blocks read(b) reads). read may lower bounds[b]; each
// group read then gets the largest of its blocks' bounds, so a group left high by something that only
// shrank it is read once more, not every time. The groups and blocks read are scattered over the bounds
// and the residual: each set of them is prefetched before it is read, so that their cache misses overlap.
template <typename T, typename Read>
void for_each_bounded_block(std::int64_t n, std::int64_t g0, std::int64_t g1, T* bounds, const T* x,
                            typename FloatBits<T>::U tb, Read read) {
  const std::int64_t blocks = bound_blocks(n);
  T* groups = bounds + blocks;
  const auto read_group = [&](std::int64_t g) {
    const std::int64_t first = g * kBoundGroup, last = std::min(blocks, first + kBoundGroup);
    std::int64_t hits[kBoundGroup];
    int count = 0;
    std::int64_t b = first;
    for (; b + 16 <= last; b += 16) {
      for (std::uint32_t mask = qualify_mask16(bounds + b, tb); mask != 0; mask &= mask - 1) {
        hits[count++] = b + __builtin_ctz(mask);
      }
    }
    for (; b < last; ++b) {
      if (qualifies(bounds[b], tb)) hits[count++] = b;
    }
    for (int k = 0; k < count; ++k) __builtin_prefetch(x + hits[k] * kBoundBlock, 1);
    for (int k = 0; k < count; ++k) read(hits[k]);
    tighten_group(bounds, blocks, g);
  };
  const auto prefetch_group = [&](std::int64_t g) {
    for (std::int64_t b = g * kBoundGroup; b < std::min(blocks, (g + 1) * kBoundGroup); b += 64 / sizeof(T)) {
      __builtin_prefetch(bounds + b, 1);
    }
  };
  std::int64_t g = g0;
  for (; g + 16 <= g1; g += 16) {  // most group masks are empty after a row-sparse step
    const std::uint32_t found = qualify_mask16(groups + g, tb);
    for (std::uint32_t mask = found; mask != 0; mask &= mask - 1) prefetch_group(g + __builtin_ctz(mask));
    for (std::uint32_t mask = found; mask != 0; mask &= mask - 1) read_group(g + __builtin_ctz(mask));
  }
  for (; g < g1; ++g) {
    if (qualifies(groups[g], tb)) read_group(g);
  }
}

}  // namespace sparkgrad::compress::detail
