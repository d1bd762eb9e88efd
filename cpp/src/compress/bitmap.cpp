// Bitmap ("dense") encoding: 2 bits per element, 16 elements per int32 word; words are independent, so
// the parallel loop over words is deterministic.
#include <algorithm>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"
#include "block16.h"

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
    const int len = static_cast<int>(std::min<std::int64_t>(16, n - begin));
    std::uint32_t count = 0;
    std::uint32_t word;
    if (len == 16) {
      word = detail::bitmap_word16(x + begin, t, h, count);
    } else {
      // The last partial word goes through a zero-padded block: zeros encode nothing and stay zero.
      T block[16] = {};
      std::copy(x + begin, x + begin + len, block);
      word = detail::bitmap_word16(block, t, h, count);
      std::copy(block, block + len, x + begin);
    }
    out[kHeaderWords + w] = static_cast<std::int32_t>(word);
    encoded += count;
  }
  return encoded;
}

template std::int64_t bitmap_encode<float>(float*, std::int64_t, double, std::int32_t*);
template std::int64_t bitmap_encode<double>(double*, std::int64_t, double, std::int32_t*);

}  // namespace sparkgrad::compress
