// Message header helpers, validation and decoding (accumulate into the target) for both formats.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

std::int32_t threshold_bits(float threshold) {
  std::int32_t bits;
  std::memcpy(&bits, &threshold, sizeof bits);
  return bits;
}

float bits_threshold(std::int32_t bits) {
  float t;
  std::memcpy(&t, &bits, sizeof t);
  return t;
}

void check_encode_args(const char* op, std::int64_t n, double threshold) {
  if (n < 0 || n > INT_MAX) throw_invalid(op, "residual length must be in [0, ", INT_MAX, "], got ", n);
  const float tf = static_cast<float>(threshold);
  if (!std::isfinite(threshold) || !(tf > 0) || !std::isfinite(tf)) {
    throw_invalid(op, "threshold must be a finite float32 value > 0, got ", threshold);
  }
}

namespace {

// Index of the first sparse entry outside [-n, -1] U [1, n], or -1 if all are valid.
std::int64_t first_bad_entry(const std::int32_t* entries, std::int64_t count, std::int64_t n) {
  std::int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (count > (1 << 16))
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t v = entries[k];
    bad += (v == 0) | (v > n) | (v < -n);
  }
  if (bad == 0) return -1;
  for (std::int64_t k = 0;; ++k) {
    const std::int64_t v = entries[k];
    if (v == 0 || v > n || v < -n) return k;
  }
}

}  // namespace

void validate_message(const char* op, const std::int32_t* msg, std::int64_t len, std::int64_t n,
                      std::int32_t expected_flag) {
  if (len < kHeaderWords) throw_invalid(op, "message must hold at least ", kHeaderWords, " header words, got ", len);
  const std::int32_t flag = msg[3];
  if (flag != kFlagSparse && flag != kFlagBitmap) {
    throw_invalid(op, "message flag (word 3) must be 0 (sparse) or 1 (bitmap), got ", flag);
  }
  if (expected_flag != kFlagAny && flag != expected_flag) {
    throw_invalid(op, "message flag (word 3) must be ", expected_flag, ", got ", flag);
  }
  if (msg[1] != n) throw_invalid(op, "message encodes ", msg[1], " elements (word 1) but target has ", n);
  const float t = bits_threshold(msg[2]);
  if (!std::isfinite(t) || !(t > 0)) throw_invalid(op, "message threshold (word 2) must be finite and > 0, got ", t);
  if (flag == kFlagSparse) {
    if (msg[0] < 0 || msg[0] != len - kHeaderWords) {
      throw_invalid(op, "sparse message declares ", msg[0], " entries (word 0) but has ", len - kHeaderWords);
    }
    const std::int64_t bad = first_bad_entry(msg + kHeaderWords, len - kHeaderWords, n);
    if (bad >= 0) {
      throw_invalid(op, "sparse entry ", bad, " is ", msg[kHeaderWords + bad], ", outside +-[1, ", n, "]");
    }
    return;
  }
  if (len != bitmap_length(n)) throw_invalid(op, "bitmap message for ", n, " elements must have ", bitmap_length(n), " words, got ", len);
  if (msg[0] != n) throw_invalid(op, "bitmap message word 0 must equal the length ", n, ", got ", msg[0]);
  // Bits of the last word beyond element n-1 must be clear: they would address elements past the end.
  const int used = static_cast<int>(n % 16);
  const std::uint32_t low = (std::uint32_t{1} << used) - 1;
  const std::uint32_t allowed = low | (low << 16);
  const auto last = static_cast<std::uint32_t>(msg[len - 1]);
  if ((last & ~allowed) != 0) throw_invalid(op, "bitmap message sets bits for elements beyond ", n);
}

namespace {

template <typename T>
void sparse_decode(const std::int32_t* msg, T* target) {
  const T t = static_cast<T>(bits_threshold(msg[2]));
  const std::int32_t* entries = msg + kHeaderWords;
  // Serial: a valid message may repeat an index, and sparse payloads are short.
  for (std::int64_t k = 0, count = msg[0]; k < count; ++k) {
    const std::int32_t v = entries[k];
    if (v > 0) {
      target[v - 1] += t;
    } else {
      target[-static_cast<std::int64_t>(v) - 1] -= t;
    }
  }
}

template <typename T>
void bitmap_decode(const std::int32_t* msg, T* target, std::int64_t n) {
  const T t = static_cast<T>(bits_threshold(msg[2]));
  const T h = t / 2;
  const std::int64_t words = bitmap_length(n) - kHeaderWords;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t w = 0; w < words; ++w) {
    const auto word = static_cast<std::uint32_t>(msg[kHeaderWords + w]);
    if (word == 0) continue;
    const std::int64_t begin = w * 16;
    const std::int64_t len = std::min<std::int64_t>(16, n - begin);
    for (std::int64_t j = 0; j < len; ++j) {
      const bool value = (word >> j) & 1u;
      const bool negative = (word >> (j + 16)) & 1u;
      if (value || negative) target[begin + j] += value ? (negative ? -t : t) : -h;
    }
  }
}

}  // namespace

template <typename T>
void decode(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n,
            std::int32_t expected_flag) {
  validate_message(op, msg, len, n, expected_flag);
  if (msg[3] == kFlagSparse) {
    sparse_decode(msg, target);
  } else {
    bitmap_decode(msg, target, n);
  }
}

template void decode<float>(const char*, const std::int32_t*, std::int64_t, float*, std::int64_t, std::int32_t);
template void decode<double>(const char*, const std::int32_t*, std::int64_t, double*, std::int64_t, std::int32_t);

}  // namespace sparkgrad::compress
