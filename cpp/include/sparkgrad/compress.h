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
#include <vector>

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
};

// Pass 1: counts |x[i]| >= threshold per chunk. x: (n,). boundary < 0 means unlimited.
template <typename T>
SparsePlan threshold_plan(const T* x, std::int64_t n, double threshold, std::int64_t boundary);

// Pass 2: writes the message for `plan` into out (length kHeaderWords + plan.entries) and moves each
// encoded x[i] toward zero by the threshold. x must be unchanged since threshold_plan (checked).
template <typename T>
void threshold_encode(T* x, const SparsePlan& plan, std::int32_t* out);

// ---- bitmap format -------------------------------------------------------------------------------

// Encodes x: (n,) into out (length bitmap_length(n)). Element e uses bit e%16 ("value") and bit
// e%16+16 ("negative") of word 4 + e/16: |x| >= t -> value bit (+ negative bit if x < 0) and x moves by
// t toward zero; else x <= -t/2 -> negative bit only and x += t/2 (DL4J has no +t/2 code).
// Returns the number of elements encoded (full and half).
template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out);

// ---- decoding (accumulates into target) ----------------------------------------------------------

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

// ---- residual vector work ------------------------------------------------------------------------

// residual: (n,) += update: (n,).
template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n);

// residual: (n,) clipped to [-limit, limit] (limit >= 0).
template <typename T>
void clip(T* residual, std::int64_t n, T limit);

// ---- CUDA twins (cuda/compress/*.cu; cuda/no_cuda.cpp throws when built without CUDA) -----------
// All pointers are device pointers; sizes and semantics as the CPU functions above. Arguments are
// validated by the callers (the Python front door) except message contents, which decode validates.
namespace cuda {

// #{i : |x[i]| >= threshold} for x: (n,).
template <typename T>
std::int64_t threshold_count(const T* x, std::int64_t n, double threshold);

// Ordered compaction of the first `entries` qualifying elements into out: (kHeaderWords + entries,).
template <typename T>
void threshold_encode(T* x, std::int64_t n, double threshold, std::int64_t entries, std::int32_t* out);

// out: (bitmap_length(n),); returns the number of elements encoded.
template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out);

// msg: (len,) device message; target: (n,) += decoded msg after full validation.
template <typename T>
void decode(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n,
            std::int32_t expected_flag);

template <typename T>
void accumulate(T* residual, const T* update, std::int64_t n);

template <typename T>
void clip(T* residual, std::int64_t n, T limit);

}  // namespace cuda

}  // namespace sparkgrad::compress
