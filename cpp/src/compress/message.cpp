// Message header helpers, validation, decoding (accumulate into the target) for both formats, and
// subtracting a sparse message from a target in O(entries).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

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

void check_at_indices(const char* op, const std::int64_t* at, std::int64_t count, std::int64_t n) {
  for (std::int64_t k = 0; k < count; ++k) {
    if (at[k] < 0 || at[k] >= n) throw_invalid(op, "at", " indices must be in [0, ", n, "), got ", at[k]);
  }
}

void validate_header(const char* op, const std::int32_t* header, std::int64_t len, std::int64_t n,
                     std::int32_t expected_flag) {
  if (len < kHeaderWords) throw_invalid(op, "message must hold at least ", kHeaderWords, " header words, got ", len);
  const std::int32_t flag = header[3];
  if (flag != kFlagSparse && flag != kFlagBitmap) {
    throw_invalid(op, "message flag (word 3) must be 0 (sparse) or 1 (bitmap), got ", flag);
  }
  if (expected_flag != kFlagAny && flag != expected_flag) {
    throw_invalid(op, "message flag (word 3) must be ", expected_flag, ", got ", flag);
  }
  if (header[1] != n) throw_invalid(op, "message encodes ", header[1], " elements (word 1) but target has ", n);
  const float t = bits_threshold(header[2]);
  if (!std::isfinite(t) || !(t > 0)) throw_invalid(op, "message threshold (word 2) must be finite and > 0, got ", t);
  if (flag == kFlagSparse) {
    if (header[0] < 0 || header[0] != len - kHeaderWords) {
      throw_invalid(op, "sparse message declares ", header[0], " entries (word 0) but has ", len - kHeaderWords);
    }
    return;
  }
  if (len != bitmap_length(n)) {
    throw_invalid(op, "bitmap message for ", n, " elements must have ", bitmap_length(n), " words, got ", len);
  }
  if (header[0] != n) throw_invalid(op, "bitmap message word 0 must equal the length ", n, ", got ", header[0]);
}

void validate_bitmap_tail(const char* op, std::int32_t last_word, std::int64_t n) {
  const int used = static_cast<int>(n % 16);
  const std::uint32_t low = (std::uint32_t{1} << used) - 1;
  if ((static_cast<std::uint32_t>(last_word) & ~(low | (low << 16))) != 0) {
    throw_invalid(op, "bitmap message sets bits for elements beyond ", n);
  }
}

void throw_bad_entry(const char* op, std::int64_t k, std::int32_t v, std::int64_t n) {
  throw_invalid(op, "sparse entry ", k, " is ", v, ", outside +-[1, ", n, "]");
}

void validate_message(const char* op, const std::int32_t* msg, std::int64_t len, std::int64_t n,
                      std::int32_t expected_flag) {
  validate_header(op, msg, len, n, expected_flag);
  if (msg[3] == kFlagBitmap) {
    validate_bitmap_tail(op, msg[len - 1], n);
    return;
  }
  const std::int32_t* entries = msg + kHeaderWords;
  const std::int64_t count = len - kHeaderWords;
  std::int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (count > (1 << 16))
  for (std::int64_t k = 0; k < count; ++k) bad += entry_out_of_range(entries[k], n);
  if (bad == 0) return;
  for (std::int64_t k = 0;; ++k) {
    if (entry_out_of_range(entries[k], n)) throw_bad_entry(op, k, entries[k], n);
  }
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
    const int len = static_cast<int>(std::min<std::int64_t>(16, n - begin));
    // Unpack first, then a branch-free elementwise add (a literal 16 lets it vectorise).
    std::uint32_t codes[16];
    for (int j = 0; j < 16; ++j) codes[j] = ((word >> j) & 1u) | (((word >> (j + 16)) & 1u) << 1);
    const auto add = [&](int count) {
      for (int j = 0; j < count; ++j) target[begin + j] += from_bits<T>(bitmap_sent(codes[j], t, h, FloatBits<T>::kSign));
    };
    if (len == 16) {
      add(16);
    } else {
      add(len);
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

bool entries_ascending(const std::int32_t* entries, std::int64_t count) {
  std::int64_t descents = 0;
#pragma omp parallel for schedule(static) reduction(+ : descents) if (count > (1 << 16))
  for (std::int64_t k = 1; k < count; ++k) descents += entry_index(entries[k]) < entry_index(entries[k - 1]);
  return descents == 0;
}

std::vector<std::int32_t> sorted_entries(const std::int32_t* entries, std::int64_t count) {
  std::vector<std::int32_t> sorted(entries, entries + count);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](std::int32_t a, std::int32_t b) { return entry_index(a) < entry_index(b); });
  return sorted;
}

template <typename T>
void subtract_sparse(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n) {
  validate_message(op, msg, len, n, kFlagSparse);
  const T t = static_cast<T>(bits_threshold(msg[2]));
  const std::int64_t count = msg[0];
  const std::int32_t* entries = msg + kHeaderWords;
  std::vector<std::int32_t> sorted;
  if (!entries_ascending(entries, count)) {
    sorted = sorted_entries(entries, count);
    entries = sorted.data();
  }
  // Each run of an index is written by the thread owning its first entry: no two threads share an element.
  // The indices are scattered over the target (rows of a large table): the element kAhead entries on is
  // fetched early, so that the cache misses overlap instead of coming one after another.
  constexpr std::int64_t kAhead = 16;
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (std::int64_t k = 0; k < count; ++k) {
    if (k + kAhead < count) __builtin_prefetch(target + entry_index(entries[k + kAhead]), 1);
    subtract_run(entries, count, k, t, target);
  }
}

template void subtract_sparse<float>(const char*, const std::int32_t*, std::int64_t, float*, std::int64_t);
template void subtract_sparse<double>(const char*, const std::int32_t*, std::int64_t, double*, std::int64_t);

}  // namespace sparkgrad::compress
