// Bitmap ("dense") encoding: 2 bits per element, 16 elements per int32 word; words are independent, so
// the parallel loop over words is deterministic.
#include <algorithm>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

namespace {

// Codes of x[0..len) packed into one word; adds the number of encoded elements to count.
template <typename T>
inline std::uint32_t encode_word(T* x, int len, T t, T h, std::uint32_t& count) {
  // Codes first (elementwise, vectorises), then packing.
  std::uint32_t codes[16] = {};
  for (int j = 0; j < len; ++j) codes[j] = bitmap_code(x[j], t, h);
  std::uint32_t word = 0;
  for (int j = 0; j < 16; ++j) {
    word |= ((codes[j] & 1u) << j) | ((codes[j] >> 1) << (j + 16));
    count += codes[j] != 0;
  }
  return word;
}

}  // namespace

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
    const int len = static_cast<int>(std::min<std::int64_t>(16, n - begin));
    std::uint32_t count = 0;
    // A literal 16 gives the inlined loop a constant trip count, so it vectorises.
    const std::uint32_t word = len == 16 ? encode_word(x + begin, 16, t, h, count) : encode_word(x + begin, len, t, h, count);
    out[kHeaderWords + w] = static_cast<std::int32_t>(word);
    encoded += count;
  }
  return encoded;
}

template std::int64_t bitmap_encode<float>(float*, std::int64_t, double, std::int32_t*);
template std::int64_t bitmap_encode<double>(double*, std::int64_t, double, std::int32_t*);

}  // namespace sparkgrad::compress
