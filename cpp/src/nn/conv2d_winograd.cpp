// Winograd F(2x2, 3x3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"):
// each 2x2 output tile is A^T [ (G g G^T) . (B^T d B) ] A for the tile's 4x4 input patch d, so the
// products per output fall from 9 to 4 (16 per tile of 4) at the cost of transforms that are only adds.
// The 16 elementwise products summed over the input channels are 16 small matrix products, one per
// position xi of the 4x4 transformed tile.
//
// Every tile's 16 positions form one vector (vectorizing across positions keeps each tile's patch loads
// contiguous rows: no gathers, which GCC does not emit for x86 and which are slow on AMD anyway).
// Forward: per block of tiles, V (tile, c, 16) = B^T d B, then for 4 output channels x 4 tiles at a time
// the sums over c of U (k, c, 16) . V in registers, transformed back with bias and relu applied before the
// 2x2 outputs are stored. Blocks are independent, so the result does not depend on the thread count.
// Weight gradient: dL/dg = G^T [ sum over tiles (A dy A^T) . (B^T d B) ] G (the adjoint of the forward's
// bilinear form), summed per (k, c) position-wise over the tiles into a fixed number of partials, which
// are added in order whatever the thread count. The input gradient is the forward of dy with the kernel
// flipped (conv2d.cpp). The block code is compiled per ISA (SPARKGRAD_SIMD_CLONES).
// Rounding differs from the direct sum: the transforms add up to 4x4 inputs with weights +-1/2, +-1, so
// the error bound is a small multiple of eps times the transformed magnitudes (see the tests).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "conv2d_internal.h"
#include "kernel_util.h"
#include "sparkgrad/common.h"

// The vector helpers below return GCC vectors wider than the baseline ABI passes in registers; they are
// forced inline into each clone, so no call crosses that ABI and the warning says nothing here.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sparkgrad::nn::detail {

namespace {

constexpr int kXi = 16;  // positions of a transformed 4x4 tile, row-major: one vector of 16 values
// Tiles per block: the block's transformed inputs (and gradients) stay in L1/L2 while every output
// channel reads them.
constexpr std::int64_t kBlockTiles = 16;

// The 16 positions of one tile as one GCC vector (a zmm for float, two ymm or four xmm in the narrower
// clones): every step below works on whole tiles, with the 4x4 transforms done by shuffles between its
// rows or columns, so no per-element gathers or scatters are needed.
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kXi * sizeof(float))));
  typedef float row __attribute__((vector_size(4 * sizeof(float))));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kXi * sizeof(double))));
  typedef double row __attribute__((vector_size(4 * sizeof(double))));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
using Row = typename VecOf<T>::row;

template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
SPARKGRAD_FORCE_INLINE void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

// Row i of the result is row Ri of v (a 4x4 matrix), or column j is column Cj.
template <int R0, int R1, int R2, int R3, typename V>
SPARKGRAD_FORCE_INLINE V pick_rows(const V& v) {
  return __builtin_shufflevector(v, v, 4 * R0, 4 * R0 + 1, 4 * R0 + 2, 4 * R0 + 3, 4 * R1, 4 * R1 + 1, 4 * R1 + 2,
                                 4 * R1 + 3, 4 * R2, 4 * R2 + 1, 4 * R2 + 2, 4 * R2 + 3, 4 * R3, 4 * R3 + 1,
                                 4 * R3 + 2, 4 * R3 + 3);
}
template <int C0, int C1, int C2, int C3, typename V>
SPARKGRAD_FORCE_INLINE V pick_columns(const V& v) {
  return __builtin_shufflevector(v, v, C0, C1, C2, C3, 4 + C0, 4 + C1, 4 + C2, 4 + C3, 8 + C0, 8 + C1, 8 + C2,
                                 8 + C3, 12 + C0, 12 + C1, 12 + C2, 12 + C3);
}

// +1 / -1 per row (or column) of a 4x4 vector.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> row_signs(T s0, T s1, T s2, T s3) {
  return Vec<T>{s0, s0, s0, s0, s1, s1, s1, s1, s2, s2, s2, s2, s3, s3, s3, s3};
}
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> column_signs(T s0, T s1, T s2, T s3) {
  return Vec<T>{s0, s1, s2, s3, s0, s1, s2, s3, s0, s1, s2, s3, s0, s1, s2, s3};
}

// B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]: row (then column) i is a_i + s_i b_i with
// (a, b, s) = (0, 2, -), (1, 2, +), (2, 1, -), (1, 3, -). Multiplying by +-1 is exact, so each position
// is rounded once per stage, as with plain adds.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> input_transform(const Vec<T>& d) {
  const Vec<T> t = pick_rows<0, 1, 2, 1>(d) + row_signs<T>(-1, 1, -1, -1) * pick_rows<2, 2, 1, 3>(d);
  return pick_columns<0, 1, 2, 1>(t) + column_signs<T>(-1, 1, -1, -1) * pick_columns<2, 2, 1, 3>(t);
}

// A^T M A, A^T = [1 1 1 0; 0 1 -1 -1]: the 2x2 result sits in positions 0, 1, 4, 5.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> output_transform(const Vec<T>& m) {
  const Vec<T> minus = row_signs<T>(1, -1, 1, -1), minus_c = column_signs<T>(1, -1, 1, -1);
  const Vec<T> s = pick_rows<0, 1, 0, 1>(m) + minus * pick_rows<1, 2, 1, 2>(m) + minus * pick_rows<2, 3, 2, 3>(m);
  return pick_columns<0, 1, 0, 1>(s) + minus_c * pick_columns<1, 2, 1, 2>(s) +
         minus_c * pick_columns<2, 3, 2, 3>(s);
}

// The 4x4 input patch at (row, col) of a (rows, cols) plane, zero outside: rows wholly inside or outside
// (all rows of interior tiles, most of the border's) are copied or zeroed as a whole.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> input_patch(const T* plane, std::int64_t rows, std::int64_t cols, std::int64_t row,
                                          std::int64_t col) {
  const bool columns_inside = col >= 0 && col + 4 <= cols;
  Row<T> r[4] = {};
  for (int i = 0; i < 4; ++i) {
    const bool row_inside = row + i >= 0 && row + i < rows;
    const T* at = plane + (row + i) * cols + col;
    if (row_inside && columns_inside) {
      std::memcpy(&r[i], at, sizeof r[i]);
    } else {
      for (int j = 0; j < 4; ++j) r[i][j] = row_inside && col + j >= 0 && col + j < cols ? at[j] : T(0);
    }
  }
  return __builtin_shufflevector(__builtin_shufflevector(r[0], r[1], 0, 1, 2, 3, 4, 5, 6, 7),
                                 __builtin_shufflevector(r[2], r[3], 0, 1, 2, 3, 4, 5, 6, 7), 0, 1, 2, 3, 4, 5, 6, 7,
                                 8, 9, 10, 11, 12, 13, 14, 15);
}

// A dy A^T for the 2x2 output gradient at (row, col) of a (rows, cols) plane (zero outside), with
// A^T = [1 1 1 0; 0 1 -1 -1]: each position is a signed sum of the four values, added in a fixed order.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> gradient_transform(const T* plane, std::int64_t rows, std::int64_t cols,
                                                 std::int64_t row, std::int64_t col) {
  const bool right = col + 1 < cols, below = row + 1 < rows;
  const T* at = plane + row * cols + col;
  const T d00 = at[0], d01 = right ? at[1] : T(0), d10 = below ? at[cols] : T(0);
  const T d11 = right && below ? at[cols + 1] : T(0);
  // The coefficient of each dy value at every position: the outer product of its A column pair.
  const Vec<T> c00{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0};
  const Vec<T> c01{0, 1, -1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 0, 0, 0};
  const Vec<T> c10{0, 0, 0, 0, 1, 1, 1, 0, -1, -1, -1, 0, -1, -1, -1, 0};
  const Vec<T> c11{0, 0, 0, 0, 0, 1, -1, -1, 0, -1, 1, 1, 0, -1, 1, 1};
  return d00 * c00 + d01 * c01 + d10 * c10 + d11 * c11;
}

// Tile t of a (tiles_h, tiles_w) grid per image: its image and the top-left of its 2x2 outputs.
struct Tile {
  std::int64_t image, row, col;
};
SPARKGRAD_FORCE_INLINE Tile locate(const Conv2dShape& g, std::int64_t t) {
  const std::int64_t tiles_w = (g.q + 1) / 2, per_image = (g.p + 1) / 2 * tiles_w, rem = t % per_image;
  return {t / per_image, 2 * (rem / tiles_w), 2 * (rem % tiles_w)};
}

// The 4x4 patch at `at` (its top-left) of a plane with `cols` columns, all of it inside.
template <typename T>
SPARKGRAD_FORCE_INLINE Vec<T> inner_patch(const T* at, std::int64_t cols) {
  Row<T> r[4];
  for (int i = 0; i < 4; ++i) std::memcpy(&r[i], at + i * cols, sizeof r[i]);
  return __builtin_shufflevector(__builtin_shufflevector(r[0], r[1], 0, 1, 2, 3, 4, 5, 6, 7),
                                 __builtin_shufflevector(r[2], r[3], 0, 1, 2, 3, 4, 5, 6, 7), 0, 1, 2, 3, 4, 5, 6, 7,
                                 8, 9, 10, 11, 12, 13, 14, 15);
}

// v[(i * c + ch) * kXi ...] = B^T d B of tile first + i, channel ch, for `count` tiles. A tile whose patch
// lies inside the image (most of them) loads its rows without the per-row bounds checks.
template <typename T>
SPARKGRAD_FORCE_INLINE void transform_inputs(const Conv2dShape& g, std::int64_t first, std::int64_t count, const T* x,
                                             T* v) {
  const std::int64_t hw = g.h * g.w;
  for (std::int64_t i = 0; i < count; ++i) {
    const Tile t = locate(g, first + i);
    const T* image = x + t.image * g.c * hw;
    const std::int64_t row = t.row - g.pad_top, col = t.col - g.pad_left;
    T* out = v + i * g.c * kXi;
    if (row >= 0 && row + 4 <= g.h && col >= 0 && col + 4 <= g.w) {
      const T* at = image + row * g.w + col;
      for (std::int64_t ch = 0; ch < g.c; ++ch) store(out + ch * kXi, input_transform<T>(inner_patch(at + ch * hw, g.w)));
    } else {
      for (std::int64_t ch = 0; ch < g.c; ++ch) {
        store(out + ch * kXi, input_transform<T>(input_patch(image + ch * hw, g.h, g.w, row, col)));
      }
    }
  }
}

// Stores the 2x2 outputs of tile t, output channel kk, from lanes L, L+1 (top) and L+4, L+5 (bottom) of
// `out`, where they fall inside y.
template <int L, typename T>
SPARKGRAD_FORCE_INLINE void store_tile(const Conv2dShape& g, const Tile& t, std::int64_t kk, const Vec<T>& out, T* y) {
  T* at = y + ((t.image * g.k + kk) * g.p + t.row) * g.q + t.col;
  const bool right = t.col + 1 < g.q, below = t.row + 1 < g.p;
  if (right && below) {  // a whole tile (every tile of an even-sized output): two stores of two values
    typedef T Pair __attribute__((vector_size(2 * sizeof(T))));
    const Pair top = __builtin_shufflevector(out, out, L, L + 1);
    const Pair bottom = __builtin_shufflevector(out, out, L + 4, L + 5);
    std::memcpy(at, &top, sizeof top);
    std::memcpy(at + g.q, &bottom, sizeof bottom);
    return;
  }
  at[0] = out[L];
  if (right) at[1] = out[L + 1];
  if (below) at[g.q] = out[L + 4];
}

// The forward's tail for tile t, output channel kk: A^T m A + bias, relu, stored where inside y.
template <typename T>
SPARKGRAD_FORCE_INLINE void store_outputs(const Conv2dShape& g, const Tile& t, std::int64_t kk, const Vec<T>& m,
                                          T bias, bool relu, T* y) {
  Vec<T> out = output_transform<T>(m) + bias;
  if (relu) out = out > T(0) ? out : T(0);
  store_tile<0>(g, t, kk, out, y);
}

// The same for two tiles ta, tb of one output channel at once: A^T m has two useful rows, so the two
// tiles' rows share one vector (a's in rows 0-1, b's in rows 2-3) and the column stage, bias and relu
// run once for both. Every value sees the same operations in the same order as in output_transform.
template <typename T>
SPARKGRAD_FORCE_INLINE void store_output_pair(const Conv2dShape& g, const Tile& ta, const Tile& tb, std::int64_t kk,
                                              const Vec<T>& ma, const Vec<T>& mb, T bias, bool relu, T* y) {
  const Vec<T> minus = row_signs<T>(1, -1, 1, -1), minus_c = column_signs<T>(1, -1, 1, -1);
  // rows (R0, R1) of a then (R0, R1) of b
#define SPARKGRAD_ROWS(R0, R1)                                                                                     \
  __builtin_shufflevector(ma, mb, 4 * R0, 4 * R0 + 1, 4 * R0 + 2, 4 * R0 + 3, 4 * R1, 4 * R1 + 1, 4 * R1 + 2,       \
                          4 * R1 + 3, 16 + 4 * R0, 17 + 4 * R0, 18 + 4 * R0, 19 + 4 * R0, 16 + 4 * R1, 17 + 4 * R1, \
                          18 + 4 * R1, 19 + 4 * R1)
  const Vec<T> s = SPARKGRAD_ROWS(0, 1) + minus * SPARKGRAD_ROWS(1, 2) + minus * SPARKGRAD_ROWS(2, 3);
#undef SPARKGRAD_ROWS
  Vec<T> out = pick_columns<0, 1, 0, 1>(s) + minus_c * pick_columns<1, 2, 1, 2>(s) +
               minus_c * pick_columns<2, 3, 2, 3>(s) + bias;
  if (relu) out = out > T(0) ? out : T(0);
  store_tile<0>(g, ta, kk, out, y);
  store_tile<8>(g, tb, kk, out, y);
}

// Rows output channels from kk for Tiles tiles from i: the sums over input channels of U . V, kept in
// Rows x Tiles registers (independent accumulators keep the FMA pipes busy), then stored.
template <int Rows, int Tiles, typename T>
SPARKGRAD_FORCE_INLINE void multiply_tiles(const Conv2dShape& g, const Tile* tiles, std::int64_t i, std::int64_t kk,
                                           const T* u, const T* v, const T* b, bool relu, T* y) {
  Vec<T> acc[Rows][Tiles];  // zeroed one by one: an aggregate `= {}` became a rep stos through memory
  for (int r = 0; r < Rows; ++r) {
    for (int j = 0; j < Tiles; ++j) acc[r][j] = Vec<T>{};
  }
  for (std::int64_t ch = 0; ch < g.c; ++ch) {
    Vec<T> vt[Tiles];
    for (int j = 0; j < Tiles; ++j) vt[j] = load(v + ((i + j) * g.c + ch) * kXi);
    for (int r = 0; r < Rows; ++r) {
      const Vec<T> ur = load(u + ((kk + r) * g.c + ch) * kXi);
      for (int j = 0; j < Tiles; ++j) acc[r][j] += ur * vt[j];
    }
  }
  for (int r = 0; r < Rows; ++r) {
    const T bias = b ? b[kk + r] : T(0);
    int j = 0;
    for (; j + 2 <= Tiles; j += 2) {
      store_output_pair(g, tiles[i + j], tiles[i + j + 1], kk + r, acc[r][j], acc[r][j + 1], bias, relu, y);
    }
    for (; j < Tiles; ++j) store_outputs(g, tiles[i + j], kk + r, acc[r][j], bias, relu, y);
  }
}

// One block of `count` output tiles from tile `first`: u (k, c, 16) transformed kernels, v scratch
// (count, c, 16).
template <typename T>
SPARKGRAD_FORCE_INLINE void forward_block_impl(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                               const T* u, const T* x, const T* b, bool relu, T* y, T* v) {
  transform_inputs(g, first, count, x, v);
  Tile tiles[kBlockTiles];
  for (std::int64_t i = 0; i < count; ++i) tiles[i] = locate(g, first + i);
  std::int64_t kk = 0;
  for (; kk + 4 <= g.k; kk += 4) {
    std::int64_t i = 0;
    for (; i + 4 <= count; i += 4) multiply_tiles<4, 4>(g, tiles, i, kk, u, v, b, relu, y);
    for (; i < count; ++i) multiply_tiles<4, 1>(g, tiles, i, kk, u, v, b, relu, y);
  }
  for (; kk < g.k; ++kk) {
    for (std::int64_t i = 0; i < count; ++i) multiply_tiles<1, 1>(g, tiles, i, kk, u, v, b, relu, y);
  }
}
SPARKGRAD_SIMD_CLONES void forward_block(const Conv2dShape& g, std::int64_t first, std::int64_t count, const float* u,
                                         const float* x, const float* b, bool relu, float* y, float* v) {
  forward_block_impl(g, first, count, u, x, b, relu, y, v);
}
SPARKGRAD_SIMD_CLONES void forward_block(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                         const double* u, const double* x, const double* b, bool relu, double* y,
                                         double* v) {
  forward_block_impl(g, first, count, u, x, b, relu, y, v);
}

// Weight gradient of one block of `count` tiles from `first`, added to sum (k, c, 16): the inputs'
// B^T d B into v (count, c, 16), the output gradients' A dy A^T into e (count, k, 16), then per (k, c)
// the products summed over the block's tiles in tile order, 4 x 4 (k, c) pairs at a time.
template <typename T>
SPARKGRAD_FORCE_INLINE void gradient_block_impl(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                                const T* x, const T* dy, T* v, T* e, T* sum) {
  transform_inputs(g, first, count, x, v);
  const std::int64_t pq = g.p * g.q;
  for (std::int64_t i = 0; i < count; ++i) {
    const Tile t = locate(g, first + i);
    for (std::int64_t kk = 0; kk < g.k; ++kk) {
      store(e + (i * g.k + kk) * kXi, gradient_transform(dy + (t.image * g.k + kk) * pq, g.p, g.q, t.row, t.col));
    }
  }
  const auto pairs = [&](auto rows_tag, auto cols_tag, std::int64_t kk, std::int64_t ch) {
    constexpr int Rows = decltype(rows_tag)::value, Cols = decltype(cols_tag)::value;
    Vec<T> acc[Rows][Cols];
    for (int r = 0; r < Rows; ++r) {
      for (int c = 0; c < Cols; ++c) acc[r][c] = load(sum + ((kk + r) * g.c + ch + c) * kXi);
    }
    for (std::int64_t i = 0; i < count; ++i) {
      Vec<T> vc[Cols];
      for (int c = 0; c < Cols; ++c) vc[c] = load(v + (i * g.c + ch + c) * kXi);
      for (int r = 0; r < Rows; ++r) {
        const Vec<T> er = load(e + (i * g.k + kk + r) * kXi);
        for (int c = 0; c < Cols; ++c) acc[r][c] += er * vc[c];
      }
    }
    for (int r = 0; r < Rows; ++r) {
      for (int c = 0; c < Cols; ++c) store(sum + ((kk + r) * g.c + ch + c) * kXi, acc[r][c]);
    }
  };
  using One = std::integral_constant<int, 1>;
  using Four = std::integral_constant<int, 4>;
  std::int64_t kk = 0;
  for (; kk + 4 <= g.k; kk += 4) {
    std::int64_t ch = 0;
    for (; ch + 4 <= g.c; ch += 4) pairs(Four{}, Four{}, kk, ch);
    for (; ch < g.c; ++ch) pairs(Four{}, One{}, kk, ch);
  }
  for (; kk < g.k; ++kk) {
    for (std::int64_t ch = 0; ch < g.c; ++ch) pairs(One{}, One{}, kk, ch);
  }
}
SPARKGRAD_SIMD_CLONES void gradient_block(const Conv2dShape& g, std::int64_t first, std::int64_t count, const float* x,
                                          const float* dy, float* v, float* e, float* sum) {
  gradient_block_impl(g, first, count, x, dy, v, e, sum);
}
SPARKGRAD_SIMD_CLONES void gradient_block(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                          const double* x, const double* dy, double* v, double* e, double* sum) {
  gradient_block_impl(g, first, count, x, dy, v, e, sum);
}

// Per-thread scratch, reused across calls (training repeats the same shapes every step).
template <typename T, int Slot>
T* scratch(std::int64_t size) {
  thread_local std::vector<T> buffer;
  if (static_cast<std::int64_t>(buffer.size()) < size) buffer.resize(static_cast<std::size_t>(size));
  return buffer.data();
}

std::int64_t tile_count(const Conv2dShape& g) { return g.n * ((g.p + 1) / 2) * ((g.q + 1) / 2); }

// The weight gradient takes longer blocks (its (k, c) sums are loaded and stored once per block) and sums
// into kWeightRuns partials, a fixed number (not the thread count), so its result does not depend on the
// thread count either.
constexpr std::int64_t kGradientBlockTiles = 64, kWeightRuns = 8;

}  // namespace

template <typename T>
void winograd_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, bool relu, T* y) {
  // U (k, c, 16) = G g G^T per (k, c), G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
  std::vector<T> u(static_cast<std::size_t>(g.k * g.c * kXi));
  for (std::int64_t kc = 0; kc < g.k * g.c; ++kc) {
    const T* w = weights + kc * 9;
    T a[4][3];  // G g
    for (int j = 0; j < 3; ++j) {
      a[0][j] = w[j];
      a[1][j] = T(0.5) * (w[j] + w[3 + j] + w[6 + j]);
      a[2][j] = T(0.5) * (w[j] - w[3 + j] + w[6 + j]);
      a[3][j] = w[6 + j];
    }
    T* out = u.data() + kc * kXi;
    for (int i = 0; i < 4; ++i) {
      out[4 * i] = a[i][0];
      out[4 * i + 1] = T(0.5) * (a[i][0] + a[i][1] + a[i][2]);
      out[4 * i + 2] = T(0.5) * (a[i][0] - a[i][1] + a[i][2]);
      out[4 * i + 3] = a[i][2];
    }
  }
  const std::int64_t tiles = tile_count(g), blocks = (tiles + kBlockTiles - 1) / kBlockTiles;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(dynamic, 2) if (blocks > 1 && max_threads() > 1)
  for (std::int64_t block = 0; block < blocks; ++block) {
    guard.capture([&] {
      T* v = scratch<T, 0>(kBlockTiles * g.c * kXi);
      const std::int64_t first = block * kBlockTiles;
      forward_block(g, first, std::min(kBlockTiles, tiles - first), u.data(), x, b, relu, y, v);
    });
  }
  guard.rethrow();
}

template <typename T>
void winograd_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw) {
  const std::int64_t tiles = tile_count(g), blocks = (tiles + kGradientBlockTiles - 1) / kGradientBlockTiles;
  const std::int64_t runs = std::min(blocks, kWeightRuns), size = g.k * g.c * kXi;
  std::vector<T> partial(static_cast<std::size_t>(std::max<std::int64_t>(runs, 1) * size), T(0));
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(dynamic, 1) if (runs > 1 && max_threads() > 1)
  for (std::int64_t run = 0; run < runs; ++run) {
    guard.capture([&] {
      T* v = scratch<T, 0>(kGradientBlockTiles * g.c * kXi);
      T* e = scratch<T, 1>(kGradientBlockTiles * g.k * kXi);
      T* sum = partial.data() + run * size;
      for (std::int64_t block = blocks * run / runs; block < blocks * (run + 1) / runs; ++block) {
        const std::int64_t first = block * kGradientBlockTiles;
        gradient_block(g, first, std::min(kGradientBlockTiles, tiles - first), x, dy, v, e, sum);
      }
    });
  }
  guard.rethrow();
  for (std::int64_t run = 1; run < runs; ++run) {
    const T* part = partial.data() + run * size;
    for (std::int64_t i = 0; i < size; ++i) partial[i] += part[i];
  }
  // dw (k, c, 3, 3) = G^T M G per (k, c), M the summed (4, 4) products.
  for (std::int64_t kc = 0; kc < g.k * g.c; ++kc) {
    const T* mm = partial.data() + kc * kXi;
    T o[3][4];  // G^T M
    for (int j = 0; j < 4; ++j) {
      o[0][j] = mm[j] + T(0.5) * (mm[4 + j] + mm[8 + j]);
      o[1][j] = T(0.5) * (mm[4 + j] - mm[8 + j]);
      o[2][j] = T(0.5) * (mm[4 + j] + mm[8 + j]) + mm[12 + j];
    }
    T* out = dw + kc * 9;
    for (int i = 0; i < 3; ++i) {
      out[3 * i] = o[i][0] + T(0.5) * (o[i][1] + o[i][2]);
      out[3 * i + 1] = T(0.5) * (o[i][1] - o[i][2]);
      out[3 * i + 2] = T(0.5) * (o[i][1] + o[i][2]) + o[i][3];
    }
  }
}

#define SPARKGRAD_WINOGRAD(T)                                                                              \
  template void winograd_forward<T>(const Conv2dShape&, const T*, const T*, const T*, bool, T*);         \
  template void winograd_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*);
SPARKGRAD_WINOGRAD(float)
SPARKGRAD_WINOGRAD(double)

}  // namespace sparkgrad::nn::detail
