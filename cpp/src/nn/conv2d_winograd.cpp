// Winograd F(2x2, 3x3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"):
// each 2x2 output tile is A^T [ (G g G^T) . (B^T d B) ] A for the tile's 4x4 input patch d, so the
// products per output fall from 9 to 4 (16 per tile of 4) at the cost of transforms that are only adds.
// The 16 elementwise products summed over the input channels are 16 small matrix products, one per
// position xi of the 4x4 transformed tile.
//
// Forward: tiles are taken kLanes at a time across the whole batch; a block transforms its patches for
// every channel (V: 16 x c x kLanes), multiplies by the transformed kernels (U: 16 x k x c) and transforms
// back, with bias and relu applied before the 2x2 outputs are stored. Blocks are independent, so the
// result does not depend on the thread count. The block code is compiled per ISA (SPARKGRAD_SIMD_CLONES);
// its loops run over the kLanes tiles, which vectorize at any width.
// Weight gradient: dL/dg = G^T [ sum over tiles (A dy A^T) . (B^T d B) ] G (the adjoint of the forward's
// bilinear form), so per chunk of tiles the 16 products (k x tiles) @ (tiles x c) are long-reduction GEMMs
// (OpenBLAS); chunks are summed in a fixed order whatever the thread count.
// Rounding differs from the direct sum: the transforms add up to 4x4 inputs with weights +-1/2, +-1, so
// the error bound is a small multiple of eps times the transformed magnitudes (see the tests).
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "conv2d_internal.h"
#include "kernel_util.h"
#include "sparkgrad/common.h"

// The vector helpers below return GCC vectors wider than the baseline ABI passes in registers; they are
// forced inline into each clone, so no call crosses that ABI and the warning says nothing here.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sparkgrad::nn::detail {

namespace {

constexpr int kLanes = 16;  // tiles per block: one AVX-512 float vector, two AVX2 ones
constexpr int kXi = 16;     // positions of a transformed 4x4 tile

// Where each lane's Size x Size patch lies: at[e][l] is the index of element e (row-major) of lane l's
// patch in channel 0 of its image, or -1 where the element is outside the plane (padding, the last
// tile's missing half, lanes past the last tile). Indices instead of per-lane branches let the gathers
// and stores below vectorize (masked gathers / scatters on AVX-512).
template <int Size>
struct Patches {
  std::int64_t at[Size * Size][kLanes];
};

// Tiles [first, first + count) of a grid (tiles_h, tiles_w) per image, tile (ty, tx) with its patch at
// (2 ty + shift_r, 2 tx + shift_c) of each image's (rows, cols) planes, images image_stride apart.
template <int Size>
SPARKGRAD_FORCE_INLINE void locate(std::int64_t first, std::int64_t count, std::int64_t tiles_h, std::int64_t tiles_w,
                                   std::int64_t shift_r, std::int64_t shift_c, std::int64_t rows, std::int64_t cols,
                                   std::int64_t image_stride, Patches<Size>& p) {
  for (int l = 0; l < kLanes; ++l) {
    const std::int64_t tile = first + l, image = tile / (tiles_h * tiles_w), rem = tile % (tiles_h * tiles_w);
    const std::int64_t r = 2 * (rem / tiles_w) + shift_r, c = 2 * (rem % tiles_w) + shift_c;
    for (int i = 0; i < Size; ++i) {
      for (int j = 0; j < Size; ++j) {
        const bool inside = l < count && r + i >= 0 && r + i < rows && c + j >= 0 && c + j < cols;
        p.at[i * Size + j][l] = inside ? image * image_stride + (r + i) * cols + c + j : -1;
      }
    }
  }
}

// d[e][l] = element e of lane l's patch in the plane at `data` (zero outside). Outside elements load
// data[0] (always valid) and are then replaced by zero: an unconditional load is what becomes a vector
// gather; a conditional one stays scalar.
template <int Size, typename T>
SPARKGRAD_FORCE_INLINE void gather(const Patches<Size>& p, const T* data, T (&d)[Size * Size][kLanes]) {
  for (int e = 0; e < Size * Size; ++e) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const std::int64_t at = p.at[e][l];
      const T value = data[at >= 0 ? at : 0];
      d[e][l] = at >= 0 ? value : T(0);
    }
  }
}

// kLanes values of T as one GCC vector: explicit vector code, so each clone's instruction set carries
// the lanes (zmm, 2 ymm or 4 xmm per float vector) instead of the auto-vectorizer guessing the loop.
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kLanes * sizeof(float))));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kLanes * sizeof(double))));
};
template <typename T>
using Vec = typename VecOf<T>::type;
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

// v[xi * stride + l] = (B^T d B)[xi] with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
template <typename T>
SPARKGRAD_FORCE_INLINE void input_transform(const T (&d)[16][kLanes], T* v, std::int64_t stride) {
  Vec<T> t[16];  // B^T d
  for (int j = 0; j < 4; ++j) {
    const Vec<T> d0 = load(d[j]), d1 = load(d[4 + j]), d2 = load(d[8 + j]), d3 = load(d[12 + j]);
    t[j] = d0 - d2, t[4 + j] = d1 + d2, t[8 + j] = d2 - d1, t[12 + j] = d1 - d3;
  }
  for (int i = 0; i < 4; ++i) {
    T* row = v + 4 * i * stride;
    store(row, t[4 * i] - t[4 * i + 2]);
    store(row + stride, t[4 * i + 1] + t[4 * i + 2]);
    store(row + 2 * stride, t[4 * i + 2] - t[4 * i + 1]);
    store(row + 3 * stride, t[4 * i + 1] - t[4 * i + 3]);
  }
}

// e[xi * stride + l] = (A dy A^T)[xi] for a 2x2 output gradient, A^T = [1 1 1 0; 0 1 -1 -1].
template <typename T>
SPARKGRAD_FORCE_INLINE void gradient_transform(const T (&d)[4][kLanes], T* e, std::int64_t stride) {
  const Vec<T> d0 = load(d[0]), d1 = load(d[1]), d2 = load(d[2]), d3 = load(d[3]);
  const Vec<T> col0[4] = {d0, d0 + d2, d0 - d2, -d2};  // A dy, column 0
  const Vec<T> col1[4] = {d1, d1 + d3, d1 - d3, -d3};  // and column 1
  for (int i = 0; i < 4; ++i) {
    T* row = e + 4 * i * stride;
    store(row, col0[i]);
    store(row + stride, col0[i] + col1[i]);
    store(row + 2 * stride, col0[i] - col1[i]);
    store(row + 3 * stride, -col1[i]);
  }
}

// m[r * row_stride + l] = sum over ch of u[r * channels + ch] * v[ch * kLanes + l], for Rows rows at once
// (independent accumulators keep the FMA pipes busy).
template <int Rows, typename T>
SPARKGRAD_FORCE_INLINE void multiply_rows(const T* u, std::int64_t channels, const T* v, T* m,
                                          std::int64_t row_stride) {
  Vec<T> acc[Rows] = {};
  for (std::int64_t ch = 0; ch < channels; ++ch) {
    const Vec<T> vc = load(v + ch * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) acc[r] += u[r * channels + ch] * vc;
  }
  for (int r = 0; r < Rows; ++r) store(m + r * row_stride, acc[r]);
}

// One block of kLanes output tiles starting at tile `first`: u (16, k, c) transformed kernels, v scratch
// (16, c, kLanes), m scratch (k, 16, kLanes).
template <typename T>
SPARKGRAD_FORCE_INLINE void forward_block_impl(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                               const T* u, const T* x, const T* b, bool relu, T* y, T* v, T* m) {
  const std::int64_t tiles_h = (g.p + 1) / 2, tiles_w = (g.q + 1) / 2, hw = g.h * g.w, pq = g.p * g.q;
  Patches<4> in;
  Patches<2> out;
  locate(first, count, tiles_h, tiles_w, -g.pad_top, -g.pad_left, g.h, g.w, g.c * hw, in);
  locate(first, count, tiles_h, tiles_w, 0, 0, g.p, g.q, g.k * pq, out);
  for (std::int64_t ch = 0; ch < g.c; ++ch) {
    alignas(64) T d[16][kLanes];
    gather(in, x + ch * hw, d);
    input_transform(d, v + ch * kLanes, g.c * kLanes);
  }
  for (int xi = 0; xi < kXi; ++xi) {
    const T* uxi = u + xi * g.k * g.c;
    const T* vxi = v + xi * g.c * kLanes;
    std::int64_t kk = 0;
    for (; kk + 4 <= g.k; kk += 4) {
      multiply_rows<4>(uxi + kk * g.c, g.c, vxi, m + (kk * kXi + xi) * kLanes, kXi * kLanes);
    }
    for (; kk < g.k; ++kk) multiply_rows<1>(uxi + kk * g.c, g.c, vxi, m + (kk * kXi + xi) * kLanes, kXi * kLanes);
  }
  for (std::int64_t kk = 0; kk < g.k; ++kk) {
    const T* mk = m + kk * kXi * kLanes;
    Vec<T> sr[8];  // A^T M: rows 0 and 1, 4 columns each
    for (int j = 0; j < 4; ++j) {
      const Vec<T> m0 = load(mk + j * kLanes), m1 = load(mk + (4 + j) * kLanes);
      const Vec<T> m2 = load(mk + (8 + j) * kLanes), m3 = load(mk + (12 + j) * kLanes);
      sr[j] = m0 + m1 + m2, sr[4 + j] = m1 - m2 - m3;
    }
    const T bias = b ? b[kk] : T(0);
    alignas(64) T o[4][kLanes];  // the 2x2 outputs, row-major
    for (int i = 0; i < 2; ++i) {
      Vec<T> y0 = sr[4 * i] + sr[4 * i + 1] + sr[4 * i + 2] + bias;
      Vec<T> y1 = sr[4 * i + 1] - sr[4 * i + 2] - sr[4 * i + 3] + bias;
      if (relu) y0 = y0 > T(0) ? y0 : T(0), y1 = y1 > T(0) ? y1 : T(0);
      store(o[2 * i], y0), store(o[2 * i + 1], y1);
    }
    T* plane = y + kk * pq;
    for (int e = 0; e < 4; ++e) {
      for (int l = 0; l < kLanes; ++l) {
        if (out.at[e][l] >= 0) plane[out.at[e][l]] = o[e][l];
      }
    }
  }
}
SPARKGRAD_SIMD_CLONES void forward_block(const Conv2dShape& g, std::int64_t first, std::int64_t count, const float* u,
                                         const float* x, const float* b, bool relu, float* y, float* v, float* m) {
  forward_block_impl(g, first, count, u, x, b, relu, y, v, m);
}
SPARKGRAD_SIMD_CLONES void forward_block(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                         const double* u, const double* x, const double* b, bool relu, double* y,
                                         double* v, double* m) {
  forward_block_impl(g, first, count, u, x, b, relu, y, v, m);
}

// Transforms one block's input patches into v (16, c, stride) and output-gradient patches into e
// (16, k, stride), at column `column` of each row.
template <typename T>
SPARKGRAD_FORCE_INLINE void gradient_block_impl(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                                const T* x, const T* dy, T* v, T* e, std::int64_t stride) {
  const std::int64_t tiles_h = (g.p + 1) / 2, tiles_w = (g.q + 1) / 2, hw = g.h * g.w, pq = g.p * g.q;
  Patches<4> in;
  Patches<2> out;
  locate(first, count, tiles_h, tiles_w, -g.pad_top, -g.pad_left, g.h, g.w, g.c * hw, in);
  locate(first, count, tiles_h, tiles_w, 0, 0, g.p, g.q, g.k * pq, out);
  for (std::int64_t ch = 0; ch < g.c; ++ch) {
    alignas(64) T d[16][kLanes];
    gather(in, x + ch * hw, d);
    input_transform(d, v + ch * stride, g.c * stride);
  }
  for (std::int64_t kk = 0; kk < g.k; ++kk) {
    alignas(64) T d[4][kLanes];
    gather(out, dy + kk * pq, d);
    gradient_transform(d, e + kk * stride, g.k * stride);
  }
}
SPARKGRAD_SIMD_CLONES void gradient_block(const Conv2dShape& g, std::int64_t first, std::int64_t count, const float* x,
                                          const float* dy, float* v, float* e, std::int64_t stride) {
  gradient_block_impl(g, first, count, x, dy, v, e, stride);
}
SPARKGRAD_SIMD_CLONES void gradient_block(const Conv2dShape& g, std::int64_t first, std::int64_t count,
                                          const double* x, const double* dy, double* v, double* e,
                                          std::int64_t stride) {
  gradient_block_impl(g, first, count, x, dy, v, e, stride);
}

// Per-thread scratch, reused across calls (training repeats the same shapes every step).
template <typename T, int Slot>
T* scratch(std::int64_t size) {
  thread_local std::vector<T> buffer;
  if (static_cast<std::int64_t>(buffer.size()) < size) buffer.resize(static_cast<std::size_t>(size));
  return buffer.data();
}

std::int64_t tile_count(const Conv2dShape& g) { return g.n * ((g.p + 1) / 2) * ((g.q + 1) / 2); }

// Weight-gradient chunks: tiles per GEMM reduction (long enough for OpenBLAS to run near peak, short
// enough that a chunk's transforms stay in L2) and the fixed number of partial sums (independent of the
// thread count, so dw is too).
constexpr std::int64_t kChunkTiles = 256, kWeightRuns = 8;

}  // namespace

template <typename T>
void winograd_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, bool relu, T* y) {
  // U (16, k, c) = G g G^T per (k, c), G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
  std::vector<T> u(static_cast<std::size_t>(kXi * g.k * g.c));
  for (std::int64_t kc = 0; kc < g.k * g.c; ++kc) {
    const T* w = weights + kc * 9;
    T a[4][3];  // G g
    for (int j = 0; j < 3; ++j) {
      a[0][j] = w[j];
      a[1][j] = T(0.5) * (w[j] + w[3 + j] + w[6 + j]);
      a[2][j] = T(0.5) * (w[j] - w[3 + j] + w[6 + j]);
      a[3][j] = w[6 + j];
    }
    for (int i = 0; i < 4; ++i) {
      const T row[4] = {a[i][0], T(0.5) * (a[i][0] + a[i][1] + a[i][2]), T(0.5) * (a[i][0] - a[i][1] + a[i][2]),
                        a[i][2]};
      for (int j = 0; j < 4; ++j) u[static_cast<std::size_t>((i * 4 + j) * g.k * g.c + kc)] = row[j];
    }
  }
  const std::int64_t blocks = (tile_count(g) + kLanes - 1) / kLanes;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(dynamic, 4) if (blocks > 1 && max_threads() > 1)
  for (std::int64_t block = 0; block < blocks; ++block) {
    guard.capture([&] {
      T* v = scratch<T, 0>(kXi * g.c * kLanes);
      T* m = scratch<T, 1>(g.k * kXi * kLanes);
      const std::int64_t first = block * kLanes;
      forward_block(g, first, std::min<std::int64_t>(kLanes, tile_count(g) - first), u.data(), x, b, relu, y, v, m);
    });
  }
  guard.rethrow();
}

template <typename T>
void winograd_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw) {
  const std::int64_t tiles = tile_count(g), chunks = (tiles + kChunkTiles - 1) / kChunkTiles;
  const std::int64_t runs = std::min(chunks, kWeightRuns), size = kXi * g.k * g.c;
  std::vector<T> partial(static_cast<std::size_t>(std::max<std::int64_t>(runs, 1) * size), T(0));
  const bool parallel = runs > 1 && max_threads() > 1;
  std::optional<SingleThreadedBlas> hold;
  if (parallel) hold.emplace();
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (std::int64_t run = 0; run < runs; ++run) {
    guard.capture([&] {
      T* v = scratch<T, 0>(kXi * g.c * kChunkTiles);
      T* e = scratch<T, 1>(kXi * g.k * kChunkTiles);
      T* sum = partial.data() + run * size;
      for (std::int64_t chunk = chunks * run / runs; chunk < chunks * (run + 1) / runs; ++chunk) {
        const std::int64_t first = chunk * kChunkTiles, count = std::min(kChunkTiles, tiles - first);
        const std::int64_t width = (count + kLanes - 1) / kLanes * kLanes;  // padded lanes gather zeros
        for (std::int64_t at = 0; at < width; at += kLanes) {
          gradient_block(g, first + at, std::min<std::int64_t>(kLanes, count - at), x, dy, v + at, e + at, width);
        }
        for (int xi = 0; xi < kXi; ++xi) {  // sum[xi] (k, c) += e[xi] (k, width) @ v[xi]^T
          gemm<T>(Transpose::No, Transpose::Yes, g.k, g.c, width, T(1), e + xi * g.k * width, width,
                  v + xi * g.c * width, width, T(1), sum + xi * g.k * g.c, g.c);
        }
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
    T mm[16];
    for (int xi = 0; xi < kXi; ++xi) mm[xi] = partial[static_cast<std::size_t>(xi * g.k * g.c + kc)];
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
