// Multi-head dot-product attention: per (example, head) two GEMMs around a masked softmax, OpenMP over the
// (example, head) pairs. The heads stay interleaved in the feature axis (row strides heads * d), so the
// projections before and after are plain GEMMs over every step.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>

#include "recurrent_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// The operands of one (example b, head j) pair.
struct Pair {
  std::int64_t q, kv_k, kv_v, y, w;  // offsets into q, k, v (and dq, dk, dv), y / dy, weights

  Pair(const AttentionShape& s, std::int64_t item) {
    const std::int64_t b = item / s.heads, j = item % s.heads;
    q = b * s.tq * s.heads * s.d + j * s.d;
    kv_k = b * s.tk * s.heads * s.d + j * s.d;
    kv_v = b * s.tk * s.heads * s.dv + j * s.dv;
    y = b * s.tq * s.heads * s.dv + j * s.dv;
    w = item * s.tq * s.tk;
  }
};

// Softmax of each of the tq rows of w (tk scores) over the keys whose mask value is non-zero (mask: (tk) or
// null); masked keys get 0, a row without a present key all zeros. The exponentials are recurrent_util.h's
// branch-free exp_poly, so the row loops vectorize (libm's exp does not), compiled per ISA.
template <typename T>
SPARKGRAD_SIMD_CLONES void masked_softmax_rows(T* w, const T* mask, std::int64_t tq, std::int64_t tk) {
  constexpr T kNone = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < tq; ++i) {
    T* row = w + i * tk;
    T top = kNone;
    if (mask == nullptr) {
#pragma omp simd reduction(max : top)
      for (std::int64_t c = 0; c < tk; ++c) top = std::max(top, row[c]);
    } else {
#pragma omp simd reduction(max : top)
      for (std::int64_t c = 0; c < tk; ++c) top = std::max(top, mask[c] != T(0) ? row[c] : kNone);
    }
    if (top == kNone) {  // no present key
      std::fill(row, row + tk, T(0));
      continue;
    }
    T sum = 0;
    if (mask == nullptr) {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t c = 0; c < tk; ++c) {
        row[c] = exp_poly(row[c] - top);
        sum += row[c];
      }
    } else {  // a masked key's argument is replaced by 0 (whatever its score, even NaN), its factor zeroed
#pragma omp simd reduction(+ : sum)
      for (std::int64_t c = 0; c < tk; ++c) {
        const bool present = mask[c] != T(0);
        row[c] = exp_poly(present ? row[c] - top : T(0)) * (present ? T(1) : T(0));
        sum += row[c];
      }
    }
    const T inv = T(1) / sum;
#pragma omp simd
    for (std::int64_t c = 0; c < tk; ++c) row[c] *= inv;
  }
}

// dS = scale w (dw - <dw, w>) per row, in place in dw (masked keys have w = 0 and so get 0).
template <typename T>
SPARKGRAD_SIMD_CLONES void softmax_backward_rows(const T* w, T* dw, std::int64_t tq, std::int64_t tk, T scale) {
  for (std::int64_t i = 0; i < tq; ++i) {
    const T* wr = w + i * tk;
    T* dr = dw + i * tk;
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t c = 0; c < tk; ++c) dot += wr[c] * dr[c];
#pragma omp simd
    for (std::int64_t c = 0; c < tk; ++c) dr[c] = scale * wr[c] * (dr[c] - dot);
  }
}

// The GEMMs' dimensions fit BLAS's 32-bit integers: checked before the parallel loop, which must not throw.
void check_dims(const char* op, const AttentionShape& s) {
  for (std::int64_t v : {s.tq, s.tk, s.heads * s.d, s.heads * s.dv}) {
    if (v > INT_MAX) throw_invalid(op, "dimension ", v, " is outside the 32-bit BLAS range");
  }
}

}  // namespace

template <typename T>
void attention_forward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* mask, double scale,
                       T* weights, T* y) {
  check_dims("attention_forward", s);
  const std::int64_t items = s.n * s.heads, hd = s.heads * s.d, hdv = s.heads * s.dv;
#pragma omp parallel for schedule(static) if (items > 1)
  for (std::int64_t item = 0; item < items; ++item) {
    const Pair p(s, item);
    T* w = weights + p.w;
    gemm<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.d, static_cast<T>(scale), q + p.q, hd, k + p.kv_k, hd,
            T(0), w, s.tk);
    masked_softmax_rows(w, mask == nullptr ? nullptr : mask + (item / s.heads) * s.tk, s.tq, s.tk);
    gemm<T>(Transpose::No, Transpose::No, s.tq, s.dv, s.tk, T(1), w, s.tk, v + p.kv_v, hdv, T(0), y + p.y, hdv);
  }
}

template <typename T>
void attention_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* weights, const T* dy,
                        double scale, T* dweights, T* dq, T* dk, T* dv) {
  check_dims("attention_backward", s);
  const std::int64_t items = s.n * s.heads, hd = s.heads * s.d, hdv = s.heads * s.dv;
#pragma omp parallel for schedule(static) if (items > 1)
  for (std::int64_t item = 0; item < items; ++item) {
    const Pair p(s, item);
    const T* w = weights + p.w;
    T* dw = dweights + p.w;
    gemm<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.dv, T(1), dy + p.y, hdv, v + p.kv_v, hdv, T(0), dw, s.tk);
    gemm<T>(Transpose::Yes, Transpose::No, s.tk, s.dv, s.tq, T(1), w, s.tk, dy + p.y, hdv, T(0), dv + p.kv_v, hdv);
    softmax_backward_rows(w, dw, s.tq, s.tk, static_cast<T>(scale));
    gemm<T>(Transpose::No, Transpose::No, s.tq, s.d, s.tk, T(1), dw, s.tk, k + p.kv_k, hd, T(0), dq + p.q, hd);
    gemm<T>(Transpose::Yes, Transpose::No, s.tk, s.d, s.tq, T(1), dw, s.tk, q + p.q, hd, T(0), dk + p.kv_k, hd);
  }
}

#define SPARKGRAD_ATTENTION(T)                                                                                 \
  template void attention_forward<T>(const AttentionShape&, const T*, const T*, const T*, const T*, double, T*, \
                                     T*);                                                                      \
  template void attention_backward<T>(const AttentionShape&, const T*, const T*, const T*, const T*, const T*, \
                                      double, T*, T*, T*, T*);
SPARKGRAD_ATTENTION(float)
SPARKGRAD_ATTENTION(double)

}  // namespace sparkgrad::nn
