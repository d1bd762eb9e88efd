// Bitmap ("dense") encoding: 2 bits per element, 16 elements per int32 word; words are independent, so
// the parallel loop over words is deterministic.
#include <algorithm>
#include <cmath>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out) {
  check_encode_args("bitmap_encode", n, threshold);
  const float tf = static_cast<float>(threshold);
  const T t = static_cast<T>(tf);
  const T h = t / 2;
  const std::int64_t words = bitmap_length(n) - kHeaderWords;
  out[0] = static_cast<std::int32_t>(n);
  out[1] = static_cast<std::int32_t>(n);
  out[2] = threshold_bits(tf);
  out[3] = kFlagBitmap;
  std::int64_t encoded = 0;
#pragma omp parallel for schedule(static) reduction(+ : encoded) if (n > (1 << 16))
  for (std::int64_t w = 0; w < words; ++w) {
    const std::int64_t begin = w * 16;
    const std::int64_t len = std::min<std::int64_t>(16, n - begin);
    std::uint32_t word = 0;
    for (std::int64_t j = 0; j < len; ++j) {
      const T v = x[begin + j];
      const bool full = std::abs(v) >= t;
      const bool half = !full && v <= -h;  // DL4J only has the -t/2 code
      const bool negative = (full && v < 0) || half;
      word |= (static_cast<std::uint32_t>(full) << j) | (static_cast<std::uint32_t>(negative) << (j + 16));
      x[begin + j] = full ? (v < 0 ? v + t : v - t) : (half ? v + h : v);
      encoded += full || half;
    }
    out[kHeaderWords + w] = static_cast<std::int32_t>(word);
  }
  return encoded;
}

template std::int64_t bitmap_encode<float>(float*, std::int64_t, double, std::int32_t*);
template std::int64_t bitmap_encode<double>(double*, std::int64_t, double, std::int32_t*);

}  // namespace sparkgrad::compress
