// Multi-head dot-product attention: per (example, head) two matrix products around a masked softmax, OpenMP
// over the (example, head) pairs. The heads stay interleaved in the feature axis (row strides heads * d),
// so the projections before and after are plain GEMMs over every step. A pair's products are small
// (64 steps of a 16-wide head: 64x64x16), where a BLAS call's packing and dispatch cost more than its
// multiply-adds: below kSmallProductMax multiply-adds they run in small_product, register blocks
// compiled per ISA, else in gemm.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

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
    // The maximum over lanes: an elementwise max vectorizes where a max reduction does not (it may
    // reorder NaN comparisons). A NaN score is passed over here and makes its row NaN below.
    constexpr std::int64_t kLanes = 64 / sizeof(T);
    T lane_top[kLanes];
    std::fill(lane_top, lane_top + kLanes, kNone);
    for (std::int64_t c0 = 0; c0 < tk; c0 += kLanes) {
      const std::int64_t lanes = std::min(kLanes, tk - c0);
      for (std::int64_t l = 0; l < kLanes; ++l) {
        const bool present = l < lanes && (mask == nullptr || mask[c0 + l] != T(0));
        const T score = present ? row[c0 + l] : kNone;
        lane_top[l] = lane_top[l] < score ? score : lane_top[l];
      }
    }
    T top = kNone;
    for (std::int64_t l = 0; l < kLanes; ++l) top = std::max(top, lane_top[l]);
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

// c (m x n, row stride ldc) = alpha a b: a(i, p) = a[i * a_row + p * a_col] (either
// orientation, read one value at a time), b (k x n) rows contiguous at stride ldb. Register blocks of
// kRows x kCols outputs (8 vector registers of AVX2 for float) sum over p in order: the bits depend on
// the shape only.
template <typename T>
constexpr std::int64_t kCols = 64 / sizeof(T);
constexpr std::int64_t kRows = 4;

template <typename T, std::int64_t Rows, std::int64_t Cols>
SPARKGRAD_FORCE_INLINE void product_block(std::int64_t rows, std::int64_t cols, std::int64_t k, T alpha,
                                          const T* a, std::int64_t a_row, std::int64_t a_col, const T* b,
                                          std::int64_t ldb, T* c, std::int64_t ldc) {
  T acc[Rows][Cols];
  for (std::int64_t r = 0; r < Rows; ++r) {  // a loop, not "= {}": that becomes a slow rep stos
#pragma omp simd
    for (std::int64_t j = 0; j < Cols; ++j) acc[r][j] = T(0);
  }
  for (std::int64_t p = 0; p < k; ++p) {
    const T* b_row = b + p * ldb;
    for (std::int64_t r = 0; r < Rows; ++r) {
      const T a_rp = r < rows ? a[r * a_row + p * a_col] : T(0);
#pragma omp simd
      for (std::int64_t j = 0; j < Cols; ++j) acc[r][j] += a_rp * (j < cols ? b_row[j] : T(0));
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    T* c_row = c + r * ldc;
    for (std::int64_t j = 0; j < cols; ++j) c_row[j] = alpha * acc[r][j];
  }
}

template <typename T>
SPARKGRAD_SIMD_CLONES void small_product(std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                                         std::int64_t a_row, std::int64_t a_col, const T* b, std::int64_t ldb,
                                         T* c, std::int64_t ldc) {
  constexpr std::int64_t cols_max = kCols<T>;
  for (std::int64_t i = 0; i < m; i += kRows) {
    const std::int64_t rows = std::min(kRows, m - i);
    for (std::int64_t j = 0; j < n; j += cols_max) {
      const std::int64_t cols = std::min(cols_max, n - j);
      const T* a_i = a + i * a_row;
      if (rows == kRows && cols == cols_max) {  // the full block: bounds known, accumulators in registers
        product_block<T, kRows, cols_max>(kRows, cols_max, k, alpha, a_i, a_row, a_col, b + j, ldb,
                                          c + i * ldc + j, ldc);
      } else {
        product_block<T, kRows, cols_max>(rows, cols, k, alpha, a_i, a_row, a_col, b + j, ldb, c + i * ldc + j,
                                          ldc);
      }
    }
  }
}

// Above this many multiply-adds a product goes to BLAS, whose cache blocking wins on long sides.
constexpr std::int64_t kSmallProductMax = std::int64_t{1} << 18;

// c (m x n) = alpha op(a) op(b) as gemm's arguments say, through small_product when
// small: a transposed b is first copied into scratch (k x n, rows contiguous).
template <typename T>
void pair_product(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                  std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc, std::vector<T>& scratch) {
  if (m * n * k > kSmallProductMax) {
    gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, T(0), c, ldc);
    return;
  }
  if (tb == Transpose::Yes) {  // b is (n x k) at stride ldb
    scratch.resize(static_cast<std::size_t>(k * n));
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t p = 0; p < k; ++p) scratch[p * n + j] = b[j * ldb + p];
    }
    b = scratch.data();
    ldb = n;
  }
  const bool a_t = ta == Transpose::Yes;
  small_product<T>(m, n, k, alpha, a, a_t ? 1 : lda, a_t ? lda : 1, b, ldb, c, ldc);
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
#pragma omp parallel if (items > 1)
  {
    std::vector<T> scratch;
#pragma omp for schedule(static)
    for (std::int64_t item = 0; item < items; ++item) {
      const Pair p(s, item);
      T* w = weights + p.w;
      pair_product<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.d, static_cast<T>(scale), q + p.q, hd,
                      k + p.kv_k, hd, w, s.tk, scratch);
      masked_softmax_rows(w, mask == nullptr ? nullptr : mask + (item / s.heads) * s.tk, s.tq, s.tk);
      pair_product<T>(Transpose::No, Transpose::No, s.tq, s.dv, s.tk, T(1), w, s.tk, v + p.kv_v, hdv, y + p.y, hdv, scratch);
    }
  }
}

template <typename T>
void attention_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* weights, const T* dy,
                        double scale, T* dweights, T* dq, T* dk, T* dv) {
  check_dims("attention_backward", s);
  const std::int64_t items = s.n * s.heads, hd = s.heads * s.d, hdv = s.heads * s.dv;
#pragma omp parallel if (items > 1)
  {
    std::vector<T> scratch;
#pragma omp for schedule(static)
    for (std::int64_t item = 0; item < items; ++item) {
      const Pair p(s, item);
      const T* w = weights + p.w;
      T* dw = dweights + p.w;
      pair_product<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.dv, T(1), dy + p.y, hdv, v + p.kv_v, hdv, dw,
                      s.tk, scratch);
      pair_product<T>(Transpose::Yes, Transpose::No, s.tk, s.dv, s.tq, T(1), w, s.tk, dy + p.y, hdv, dv + p.kv_v,
                      hdv, scratch);
      softmax_backward_rows(w, dw, s.tq, s.tk, static_cast<T>(scale));
      pair_product<T>(Transpose::No, Transpose::No, s.tq, s.d, s.tk, T(1), dw, s.tk, k + p.kv_k, hd, dq + p.q, hd, scratch);
      pair_product<T>(Transpose::Yes, Transpose::No, s.tk, s.d, s.tq, T(1), dw, s.tk, q + p.q, hd, dk + p.kv_k, hd, scratch);
    }
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
