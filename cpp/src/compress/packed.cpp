// The packed wire form of sparse messages (see compress.h): sign bits, then index gaps as LEB128 varints.
// Serial: messages are short, and unpacking checks every byte of a payload that came off the network.
#include <cstring>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress {

namespace {

constexpr std::int64_t kHeaderBytes = kHeaderWords * 4;
constexpr int kMaxVarintBytes = 5;  // 35 bits hold any gap of a vector of at most 2^31 - 1 elements

int varint_size(std::uint32_t v) {
  int size = 1;
  while (v >= 0x80u) {
    v >>= 7;
    ++size;
  }
  return size;
}

std::int64_t sign_bytes(std::int64_t entries) { return (entries + 7) / 8; }

std::int32_t load_word(const std::uint8_t* p) {
  std::uint32_t w = 0;
  for (int b = 0; b < 4; ++b) w |= static_cast<std::uint32_t>(p[b]) << (8 * b);
  return static_cast<std::int32_t>(w);
}

void store_word(std::uint8_t* p, std::int32_t word) {
  const auto w = static_cast<std::uint32_t>(word);
  for (int b = 0; b < 4; ++b) p[b] = static_cast<std::uint8_t>(w >> (8 * b));
}

}  // namespace

std::int64_t packed_size(const std::int32_t* msg, std::int64_t len) {
  if (len < kHeaderWords || msg[3] != kFlagSparse || msg[0] != len - kHeaderWords || msg[1] < 0) return -1;
  const std::int64_t n = msg[1];
  std::int64_t size = kHeaderBytes + sign_bytes(msg[0]);
  std::int64_t previous = -1;
  for (std::int64_t k = kHeaderWords; k < len; ++k) {
    if (entry_out_of_range(msg[k], n)) return -1;
    const std::int64_t index = (msg[k] > 0 ? msg[k] : -static_cast<std::int64_t>(msg[k])) - 1;
    if (index <= previous) return -1;
    size += varint_size(static_cast<std::uint32_t>(index - previous - 1));
    previous = index;
  }
  return size;
}

void pack_sparse(const std::int32_t* msg, std::int64_t len, std::uint8_t* out) {
  for (std::int64_t w = 0; w < kHeaderWords; ++w) store_word(out + 4 * w, msg[w]);
  const std::int64_t entries = len - kHeaderWords;
  std::uint8_t* signs = out + kHeaderBytes;
  std::memset(signs, 0, static_cast<std::size_t>(sign_bytes(entries)));
  std::uint8_t* p = signs + sign_bytes(entries);
  std::int64_t previous = -1;
  for (std::int64_t k = 0; k < entries; ++k) {
    const std::int32_t v = msg[kHeaderWords + k];
    if (v < 0) signs[k / 8] |= static_cast<std::uint8_t>(1u << (k % 8));
    const std::int64_t index = (v > 0 ? v : -static_cast<std::int64_t>(v)) - 1;
    auto gap = static_cast<std::uint32_t>(index - previous - 1);
    while (gap >= 0x80u) {
      *p++ = static_cast<std::uint8_t>(gap | 0x80u);
      gap >>= 7;
    }
    *p++ = static_cast<std::uint8_t>(gap);
    previous = index;
  }
}

std::int64_t packed_entries(const char* op, const std::uint8_t* packed, std::int64_t len) {
  if (len < kHeaderBytes) throw_invalid(op, "packed message must hold the ", kHeaderBytes, " header bytes, got ", len);
  const std::int32_t entries = load_word(packed);
  const std::int32_t n = load_word(packed + 4);
  const std::int32_t flag = load_word(packed + 12);
  if (flag != kFlagSparse) throw_invalid(op, "packed message flag (word 3) must be 0 (sparse), got ", flag);
  if (entries < 0 || n < 0) throw_invalid(op, "packed message declares ", entries, " entries of ", n, " elements");
  // Each entry takes at least one byte of gap and an eighth of a sign byte.
  if (entries > len - kHeaderBytes || kHeaderBytes + sign_bytes(entries) + entries > len) {
    throw_invalid(op, "packed message declares ", entries, " entries but has only ", len, " bytes");
  }
  return entries;
}

void unpack_sparse(const char* op, const std::uint8_t* packed, std::int64_t len, std::int32_t* out) {
  const std::int64_t entries = packed_entries(op, packed, len);
  const std::int64_t n = load_word(packed + 4);
  for (std::int64_t w = 0; w < kHeaderWords; ++w) out[w] = load_word(packed + 4 * w);
  const std::uint8_t* signs = packed + kHeaderBytes;
  if (entries % 8 != 0 && (signs[entries / 8] >> (entries % 8)) != 0) {
    throw_invalid(op, "packed message sets sign bits beyond its ", entries, " entries");
  }
  const std::uint8_t* p = signs + sign_bytes(entries);
  const std::uint8_t* end = packed + len;
  std::int64_t previous = -1;
  for (std::int64_t k = 0; k < entries; ++k) {
    std::uint64_t gap = 0;
    for (int b = 0;; ++b) {
      if (p == end) throw_invalid(op, "packed message ends inside entry ", k, " of ", entries);
      const std::uint8_t byte = *p++;
      gap |= static_cast<std::uint64_t>(byte & 0x7fu) << (7 * b);
      if (!(byte & 0x80u)) {
        if (b > 0 && byte == 0) throw_invalid(op, "packed entry ", k, " has an overlong varint");
        break;
      }
      if (b + 1 == kMaxVarintBytes) throw_invalid(op, "packed entry ", k, " has a varint over ", kMaxVarintBytes, " bytes");
    }
    const std::int64_t index = previous + 1 + static_cast<std::int64_t>(gap);
    if (index >= n) throw_invalid(op, "packed entry ", k, " addresses element ", index, " of a vector of ", n);
    const auto id = static_cast<std::int32_t>(index + 1);
    out[kHeaderWords + k] = (signs[k / 8] >> (k % 8)) & 1u ? -id : id;
    previous = index;
  }
  if (p != end) throw_invalid(op, "packed message has ", end - p, " bytes after its ", entries, " entries");
}

}  // namespace sparkgrad::compress
