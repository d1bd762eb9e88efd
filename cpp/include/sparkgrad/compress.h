// Strom (2015) threshold encoding in Deeplearning4j's wire format, CPU (cpp/src/compress) and CUDA
// (cuda/compress) twins.
//
// A message is an int32 array `[n, N, bits, flag, payload...]`: N = dense length, bits = the threshold's
// float32 bit pattern, flag 0 = sparse (payload: n entries +-(i+1), ascending), flag 1 = bitmap (word 0
// holds N; payload: N/16 + 1 words, 2 bits per element, see bitmap_encode).
// Residuals are float32 or float64 (T). The threshold always travels as float32; encoders compare and
// subtract the float32 value cast to T, exactly what decoders add, so encoding conserves residual mass.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

// Per-element codes shared by the CPU loops and the CUDA kernels.
#ifdef __CUDACC__
#define SPARKGRAD_HD __host__ __device__
#else
#define SPARKGRAD_HD
#endif

namespace sparkgrad::compress {

inline constexpr std::int64_t kHeaderWords = 4;
inline constexpr std::int32_t kFlagSparse = 0;
inline constexpr std::int32_t kFlagBitmap = 1;
// Any flag accepted by validate_message / decode.
inline constexpr std::int32_t kFlagAny = -1;

// Float32 bit pattern of a threshold (word 2 of a message) and back.
std::int32_t threshold_bits(float threshold);
float bits_threshold(std::int32_t bits);

// Length in int32 words of a bitmap message for a vector of n elements.
inline std::int64_t bitmap_length(std::int64_t n) { return n / 16 + 5; }

// The encoding handler's format choice: sparse when its message (header + count entries) is no longer
// than the bitmap message, so whichever is smaller is sent and nothing is encoded twice.
inline bool sparse_is_smaller(std::int64_t count, std::int64_t n) {
  return kHeaderWords + count <= bitmap_length(n);
}

// Throws std::invalid_argument naming `op` unless threshold is finite and > 0 (and representable as a
// positive float32) and n fits the int32 header.
void check_encode_args(const char* op, std::int64_t n, double threshold);

// Throws std::invalid_argument naming `op` unless each of the `count` indices `at` is in [0, n).
void check_at_indices(const char* op, const std::int64_t* at, std::int64_t count, std::int64_t n);

// IEEE-754 bit patterns (host and device): the per-element codes below work on them so the CPU loops
// are branch-free and vectorise, and comparisons exclude NaN by construction.
template <typename T>
struct FloatBits;
template <>
struct FloatBits<float> {
  using U = std::uint32_t;
  static constexpr U kSign = 0x80000000u;
  static constexpr U kInf = 0x7f800000u;
};
template <>
struct FloatBits<double> {
  using U = std::uint64_t;
  static constexpr U kSign = 0x8000000000000000ull;
  static constexpr U kInf = 0x7ff0000000000000ull;
};

template <typename T>
SPARKGRAD_HD inline typename FloatBits<T>::U to_bits(T v) {
  typename FloatBits<T>::U b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

template <typename T>
SPARKGRAD_HD inline T from_bits(typename FloatBits<T>::U b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// 1 if a (a magnitude's bit pattern) is in [m, inf] for m = bits of a finite positive magnitude; NaN -> 0.
template <typename U>
SPARKGRAD_HD inline U at_least(U a, U m, U inf) {
  return static_cast<U>((a - m) <= (inf - m));
}

// Sparse entry for an element v with |v| >= t at index i: +-(i+1); moves v toward zero by t.
template <typename T>
SPARKGRAD_HD inline std::int32_t sparse_entry(T& v, T t, std::int64_t i) {
  const auto id = static_cast<std::int32_t>(i + 1);
  const auto sign = to_bits(v) & FloatBits<T>::kSign;
  v -= from_bits<T>(to_bits(t) | sign);
  return sign ? -id : id;
}

// Bit pattern of the value a bitmap code sends: 1 -> +t, 3 -> -t, 2 -> -t/2 (h = t/2), 0 -> `none`
// (+0 when subtracting from a residual, -0 when adding to a target: both leave every value exact).
template <typename T>
SPARKGRAD_HD inline typename FloatBits<T>::U bitmap_sent(std::uint32_t code, T t, T h,
                                                         typename FloatBits<T>::U none) {
  using U = typename FloatBits<T>::U;
  const U value = code & 1u;
  const U negative = code >> 1;
  const U half = negative & (value ^ 1u);
  const U sign = negative * FloatBits<T>::kSign;
  return ((to_bits(t) | sign) & (U{0} - value)) | ((to_bits(h) | sign) & (U{0} - half)) |
         (none & (U{0} - static_cast<U>(code == 0)));
}

// Bitmap code of element v (bit 0 "value", bit 1 "negative"; 0 = not encoded); v moves by what the code
// sends: |v| >= t -> +-t; else v <= -t/2 -> -t/2 (DL4J has no +t/2 code).
template <typename T>
SPARKGRAD_HD inline std::uint32_t bitmap_code(T& v, T t, T h) {
  using U = typename FloatBits<T>::U;
  const U b = to_bits(v);
  const U a = b & ~FloatBits<T>::kSign;
  const U full = at_least(a, to_bits(t), FloatBits<T>::kInf);
  const U negative = (b >> (8 * sizeof(T) - 1)) & at_least(a, to_bits(h), FloatBits<T>::kInf);
  const auto code = static_cast<std::uint32_t>(full | (negative << 1));
  // an element not encoded stays bit-exact: a GPU's NaN - 0 is the canonical NaN, not the operand's NaN
  if (code != 0) v -= from_bits<T>(bitmap_sent(code, t, h, U{0}));
  return code;
}

// A sparse entry is valid iff it addresses an element of a vector of n: v in +-[1, n].
SPARKGRAD_HD inline bool entry_out_of_range(std::int64_t v, std::int64_t n) { return v == 0 || v > n || v < -n; }

// The index a valid sparse entry +-(i+1) addresses.
SPARKGRAD_HD inline std::int64_t entry_index(std::int32_t v) { return (v > 0 ? std::int64_t{v} : -std::int64_t{v}) - 1; }

// subtract_sparse's step for entry k of entries: (count,) whose equal indices are adjacent: if k starts the
// run of its index, target[index] -= the run's +-t summed from +0 in entry order (what decoding the
// message into zeros leaves there); an entry continuing a run does nothing.
template <typename T>
SPARKGRAD_HD inline void subtract_run(const std::int32_t* entries, std::int64_t count, std::int64_t k, T t,
                                      T* target) {
  const std::int64_t i = entry_index(entries[k]);
  if (k > 0 && entry_index(entries[k - 1]) == i) return;
  T sum = 0;
  for (std::int64_t j = k; j < count && entry_index(entries[j]) == i; ++j) {
    if (entries[j] > 0) {
      sum += t;
    } else {
      sum -= t;
    }
  }
  target[i] -= sum;
}

// ---- sparse ("flexible") threshold format --------------------------------------------------------

// Result of the counting pass: per-chunk offsets into the payload, so that the writing pass can emit
// entries in ascending order from any number of threads.
struct SparsePlan {
  std::int64_t n = 0;             // dense length
  float threshold = 0.0f;         // float32 threshold written to the header
  std::int64_t count = 0;         // #{i : |x[i]| >= threshold}
  std::int64_t entries = 0;       // min(count, boundary): payload length of the message
  std::int64_t chunk = 0;         // elements per chunk
  std::vector<std::int64_t> offsets;  // chunks + 1 exclusive prefix sums of per-chunk counts
  // Qualifying indices of chunk c, ascending: offsets[c+1] - offsets[c] of them at a fixed per-chunk
  // stride (private to threshold.cpp), or packed at indices[offsets[c]], recorded by the counting pass
  // for the writing pass.
  std::unique_ptr<std::int32_t[]> indices;
  bool packed = false;
};

// Pass 1: counts |x[i]| >= threshold per chunk. x: (n,). boundary < 0 means unlimited.
template <typename T>
SparsePlan threshold_plan(const T* x, std::int64_t n, double threshold, std::int64_t boundary);

// Pass 2: writes the message for `plan` into out (length kHeaderWords + plan.entries) and moves each
// encoded x[i] toward zero by the threshold. x must be unchanged since threshold_plan (checked for the
// recorded elements, which are the only ones read).
template <typename T>
void threshold_encode(T* x, const SparsePlan& plan, std::int32_t* out);

// ---- per-block magnitude bounds of a residual ----------------------------------------------------

// A residual's bounds, in two levels: bounds[b] >= |x[i]| for every non-NaN element of block b, the
// elements [b * kBoundBlock, (b + 1) * kBoundBlock) of x (NaN never qualifies), for b < bound_blocks(n);
// then bounds[bound_blocks(n) + g] >= |x[i]| for every non-NaN element of group g, the blocks
// [g * kBoundGroup, (g + 1) * kBoundGroup). With them the counting pass reads only the groups and then
// the blocks whose bound reaches the threshold, so a step whose update touched a few rows of a large
// embedding table costs what it touched and what it sends instead of a pass over the whole residual (or
// over one bound per 16 of its elements: 4 MB at 17M parameters).
inline constexpr std::int64_t kBoundBlock = 16;
inline constexpr std::int64_t kBoundGroup = 64;

// Number of bound blocks of a vector of n elements.
inline std::int64_t bound_blocks(std::int64_t n) { return (n + kBoundBlock - 1) / kBoundBlock; }
// Number of bound groups of a vector of n elements.
inline std::int64_t bound_groups(std::int64_t n) { return (bound_blocks(n) + kBoundGroup - 1) / kBoundGroup; }
// Length of a bounds vector of a vector of n elements: its blocks' bounds, then its groups'.
inline std::int64_t bounds_length(std::int64_t n) { return bound_blocks(n) + bound_groups(n); }

// threshold_plan reading only the groups and blocks of x whose bound reaches the threshold: the same plan
// whenever bounds: (bounds_length(n),) hold. A block it reads without a qualifying element gets its exact
// bound; a group it reads gets the largest of its blocks' bounds.
template <typename T>
SparsePlan threshold_plan_bounded(const T* x, std::int64_t n, double threshold, std::int64_t boundary,
                                  T* bounds);

// The exact bound of every block and group of x: (n,).
template <typename T>
void block_bounds(const T* x, std::int64_t n, T* bounds);

// The exact bounds of the blocks holding x[at[k]] for k < count, their groups' bounds raised to hold them
// (at: indices in [0, n), else std::invalid_argument naming `op` and nothing written).
template <typename T>
void block_bounds_at(const char* op, const T* x, std::int64_t n, T* bounds, const std::int64_t* at,
                     std::int64_t count);

// After threshold_encode(x, plan, ...): the exact bounds of the blocks it encoded elements of, and their
// groups' bounds the largest of their blocks'.
template <typename T>
void block_bounds_encoded(const T* x, const SparsePlan& plan, T* bounds);

// ---- bitmap format -------------------------------------------------------------------------------

// Encodes x: (n,) into out (length bitmap_length(n)). Element e uses bit e%16 ("value") and bit
// e%16+16 ("negative") of word 4 + e/16: |x| >= t -> value bit (+ negative bit if x < 0) and x moves by
// t toward zero; else x <= -t/2 -> negative bit only and x += t/2 (DL4J has no +t/2 code).
// Returns the number of elements encoded (full and half).
template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out);

// ---- decoding (accumulates into target) ----------------------------------------------------------

// Checks the header words of a message of `len` words for a target of n elements: length, flag
// (== expected_flag unless kFlagAny), word 0 and 1, threshold. header: its first kHeaderWords words.
void validate_header(const char* op, const std::int32_t* header, std::int64_t len, std::int64_t n,
                     std::int32_t expected_flag);
// Bits of the last bitmap word beyond element n-1 must be clear.
void validate_bitmap_tail(const char* op, std::int32_t last_word, std::int64_t n);
// Error for sparse entry number k (value v) outside +-[1, n].
[[noreturn]] void throw_bad_entry(const char* op, std::int64_t k, std::int32_t v, std::int64_t n);

// Validates msg: (len,) against a target of n elements: header, length, flag (== expected_flag unless
// kFlagAny), threshold, and every index / every unused bitmap bit. Throws std::invalid_argument naming
// `op`; reads only.
void validate_message(const char* op, const std::int32_t* msg, std::int64_t len, std::int64_t n,
                      std::int32_t expected_flag);

// target: (n,) += decoded msg. Validates first (see validate_message), so a malformed message leaves
// target untouched. expected_flag: kFlagSparse, kFlagBitmap or kFlagAny (dispatch on msg[3]).
template <typename T>
void decode(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n,
            std::int32_t expected_flag);

// ---- subtracting a sparse message from parameters ------------------------------------------------

// Whether sparse entries: (count,) address non-decreasing indices (every repeated index adjacent), as the
// encoders and unpack_sparse write them. Reads only.
bool entries_ascending(const std::int32_t* entries, std::int64_t count);
// The entries: (count,) stably sorted by index: an index's entries keep their message order.
std::vector<std::int32_t> sorted_entries(const std::int32_t* entries, std::int64_t count);

// target: (n,) -= the sparse msg: (len,) decoded, touching only the message's indices and bit-identical to
// decoding msg into a zero vector and subtracting that vector (the entries of an index are summed from +0
// in message order, then subtracted once; see subtract_run). Validates first (see validate_message; the
// flag must be kFlagSparse, a bitmap goes through decode), so a malformed message leaves target untouched.
// A message whose indices are not ascending is applied through a sorted copy of its entries.
template <typename T>
void subtract_sparse(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n);

// ---- packed wire form of a sparse message --------------------------------------------------------
// A sparse message with strictly ascending indices, as it travels in an UPDATE frame: its 4 header words
// (little-endian int32), then one sign bit per entry (bit k % 8 of byte k / 8, set for a negative entry,
// unused bits clear), then per entry the gap to the previous index minus one (the first: its index) as
// an unsigned LEB128 varint of at most 5 bytes. At the densities of gradient sharing a gap takes 1-2
// bytes against the 4 of an int32 entry.
// Bytes pack_sparse would write for msg: (len,), or -1 when msg is not a sparse message with strictly
// ascending entries in +-[1, n] (it then travels as it is). Reads only.
std::int64_t packed_size(const std::int32_t* msg, std::int64_t len);
// Writes the packed form (packed_size(msg, len) bytes, which must be >= 0) to out.
void pack_sparse(const std::int32_t* msg, std::int64_t len, std::uint8_t* out);
// Entries of a packed message of `len` bytes after checking its header (flag 0, word 0 >= 0, word 1 >= 0)
// and that the payload has room for that many entries; throws std::invalid_argument naming `op`.
std::int64_t packed_entries(const char* op, const std::uint8_t* packed, std::int64_t len);
// Writes the int32 message (kHeaderWords + packed_entries words) of a packed one to out, checking every
// byte: sign bits, varints (at most 5 bytes, no overlong form), indices below word 1, and that
// the entries end exactly at the last byte. Throws std::invalid_argument naming `op`.
void unpack_sparse(const char* op, const std::uint8_t* packed, std::int64_t len, std::int32_t* out);

// ---- residual vector work ------------------------------------------------------------------------

// residual: (n,) += scale * update: (n,) (the product rounded to T, then added).
template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n, T scale);
// The same at the `count` int64 indices `at` only (a row-sparse step's support): each must be in [0, n)
// (checked first: std::invalid_argument naming `op`, nothing written); an index given twice adds once, as
// NumPy's residual[at] += scale * update[at].
template <typename T>
void accumulate_at(const char* op, T* residual, const T* update, std::int64_t n, T scale, const std::int64_t* at,
                   std::int64_t count);

// residual: (n,) clipped to [-limit, limit] (limit >= 0).
template <typename T>
void clip(T* residual, std::int64_t n, T limit);

// clip reading only the blocks whose bound reaches the limit (bounds: (bounds_length(n),) that hold, see
// threshold_plan_bounded): the same residual, since no other block has an element beyond the limit; the
// bounds of the blocks it clipped become the limit, so they still hold.
template <typename T>
void clip_bounded(T* residual, std::int64_t n, T limit, T* bounds);

// ---- CUDA twins (cuda/compress/*.cu; cuda/no_cuda.cpp throws when built without CUDA) -----------
// All pointers are device pointers; sizes and semantics as the CPU functions above. Arguments are
// validated by the callers (the Python front door) except message contents, which decode validates.
namespace cuda {

// Sparse encoding in one pass over x, queued on the calling thread's stream without waiting for it: writes
// the message of the first min(count, limit) elements with |x[i]| >= threshold (ascending index order) to
// message, whose capacity is kHeaderWords + min(n, limit) words, and moves each of them toward zero by
// the threshold, as the CPU's threshold_plan + threshold_encode with boundary `limit` (>= 0). The entry
// count reaches the host only in header word 0, once the stream has run (message_entries reads it).
template <typename T>
void threshold_encode(T* x, std::int64_t n, double threshold, std::int64_t limit, std::int32_t* message);

// Word 0 of a device message (a sparse message's entry count) after waiting for the calling thread's stream.
std::int64_t message_entries(const std::int32_t* message);

// A message in host memory owned by the calling thread, valid until its next call of this namespace.
struct HostMessage {
  const std::int32_t* words;
  std::int64_t length;
  bool bitmap;
};

// The encoding handler's step (the CPU's is encode_smaller in python/bindings/compress.cpp): encodes x as
// the sparse message when sparse_is_smaller(count, n), else as the bitmap message, moving x exactly as
// the CPU does, and copies the message to the host. The common sparse case is one pass over x and one
// wait for the stream; a bitmap takes a second round trip.
template <typename T>
HostMessage encode_smaller(T* x, std::int64_t n, double threshold);

// out: (bitmap_length(n),); returns the number of elements encoded.
template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out);

// msg: (len,) device message; target: (n,) += decoded msg after full validation.
template <typename T>
void decode(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n,
            std::int32_t expected_flag);

// msg: (len,) device message; target: (n,) -= decoded sparse msg, as the CPU's subtract_sparse (a
// message with indices not ascending is sorted on the host: the encoders never write one).
template <typename T>
void subtract_sparse(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n);

template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n);

template <typename T>
void clip(T* residual, std::int64_t n, T limit);

}  // namespace cuda

}  // namespace sparkgrad::compress
