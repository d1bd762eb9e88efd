// Max / average 2-D pooling and global pooling over NCHW planes; OpenMP over the (n, c) planes.
#include <algorithm>
#include <cstring>
#include <limits>

#include "kernel_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

PoolKind parse_pool_kind(const char* op, const std::string& name, bool allow_sum) {
  if (name == "max") return PoolKind::Max;
  if (name == "avg") return PoolKind::Avg;
  if (allow_sum && name == "sum") return PoolKind::Sum;
  throw_invalid(op, "unknown pooling kind '", name,
                allow_sum ? "', expected max, avg or sum" : "', expected max or avg");
}

namespace {

// In-bounds input rows [begin, end) of output row i (same formula for columns).
struct Range {
  std::int64_t begin, end;
};
Range window(std::int64_t i, std::int64_t stride, std::int64_t pad, std::int64_t kernel, std::int64_t size) {
  const std::int64_t start = i * stride - pad;
  return {std::max<std::int64_t>(start, 0), std::min(start + kernel, size)};
}

// Max windows of `rows` (1 or 2) rows by 2 columns at stride (rows, 2) without padding: 2x2 is the common
// 2-D max pooling, 1x2 a 1-D max pooling of 2 over time (Subsampling1DLayer's (N, C, 1, T) view). Every
// window lies inside the input.
bool max_rows_x2(PoolKind kind, const Pool2dShape& g, std::int64_t rows) {
  return kind == PoolKind::Max && g.kernel_h == rows && g.kernel_w == 2 && g.stride_h == rows &&
         g.stride_w == 2 && g.pad_top == 0 && g.pad_left == 0 && rows * g.p <= g.h && 2 * g.q <= g.w;
}

// N values of type T as one GCC vector (a class member: a vector_size that depends on a function
// template's parameters is silently dropped).
template <typename T, int N>
struct VecN {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};

// N adjacent Rows x 2 max windows of output row i from output column j, in vectors: the top (and bottom)
// input rows are split into even and odd columns (a b / c d per window) and the general loop's rule (the
// first value greater than every earlier one and than -inf wins, else the window's first value) becomes
// selects, with no data-dependent branches to mispredict.
template <int N, int Rows, typename T>
SPARKGRAD_FORCE_INLINE void max_windows(const T* xp, std::int64_t w, std::int64_t i, std::int64_t j, T* y_row,
                                        std::int64_t* argmax_row, std::int64_t count) {
  using Values = typename VecN<T, N>::type;
  using Pairs = typename VecN<T, 2 * N>::type;
  using Index = typename VecN<std::int64_t, N>::type;
  Pairs top{}, bottom{};  // count (<= N) windows: the lanes past them are zeros, computed but not stored
  std::memcpy(&top, xp + Rows * i * w + 2 * j, static_cast<std::size_t>(2 * count) * sizeof(T));
  if constexpr (Rows == 2) {
    std::memcpy(&bottom, xp + (2 * i + 1) * w + 2 * j, static_cast<std::size_t>(2 * count) * sizeof(T));
  }
  Values a, b, c, d;
  Index at;  // the flat index of each window's top-left input
  for (int e = 0; e < N; ++e) {  // constant indices: GCC turns these into even/odd shuffles
    a[e] = top[2 * e];
    b[e] = top[2 * e + 1];
    c[e] = bottom[2 * e];
    d[e] = bottom[2 * e + 1];
    at[e] = Rows * i * w + 2 * (j + e);
  }
  const Values lowest = Values{} - std::numeric_limits<T>::infinity();
  Values best = a > lowest ? a : lowest, value = a;
  Index index = at;
  const auto take = [&](const Values& v, std::int64_t offset) {
    const auto greater = v > best;
    const Index wide = __builtin_convertvector(greater, Index);
    best = greater ? v : best;
    value = greater ? v : value;
    index = wide ? at + offset : index;
  };
  take(b, 1);
  if constexpr (Rows == 2) {
    take(c, w);
    take(d, w + 1);
  }
  std::memcpy(y_row + j, &value, static_cast<std::size_t>(count) * sizeof(T));
  std::memcpy(argmax_row + j, &index, static_cast<std::size_t>(count) * sizeof(std::int64_t));
}

template <int Rows, typename T>
SPARKGRAD_FORCE_INLINE void max_plane_impl(const Pool2dShape& g, const T* xp, T* yp, std::int64_t* argmax) {
  const std::int64_t p = g.p, q = g.q, w = g.w;
  for (std::int64_t i = 0; i < p; ++i) {
    std::int64_t j = 0;
    for (; j + 8 <= q; j += 8) max_windows<8, Rows>(xp, w, i, j, yp + i * q, argmax + i * q, 8);
    for (; j + 4 <= q; j += 4) max_windows<4, Rows>(xp, w, i, j, yp + i * q, argmax + i * q, 4);
    if (j < q) max_windows<4, Rows>(xp, w, i, j, yp + i * q, argmax + i * q, q - j);  // the last 1-3
  }
}
SPARKGRAD_SIMD_CLONES void max_2x2_plane(const Pool2dShape& g, const float* xp, float* yp, std::int64_t* argmax) {
  max_plane_impl<2>(g, xp, yp, argmax);
}
SPARKGRAD_SIMD_CLONES void max_2x2_plane(const Pool2dShape& g, const double* xp, double* yp, std::int64_t* argmax) {
  max_plane_impl<2>(g, xp, yp, argmax);
}
SPARKGRAD_SIMD_CLONES void max_1x2_plane(const Pool2dShape& g, const float* xp, float* yp, std::int64_t* argmax) {
  max_plane_impl<1>(g, xp, yp, argmax);
}
SPARKGRAD_SIMD_CLONES void max_1x2_plane(const Pool2dShape& g, const double* xp, double* yp, std::int64_t* argmax) {
  max_plane_impl<1>(g, xp, yp, argmax);
}

}  // namespace

// x: (n, c, h, w) -> y, argmax: (n, c, p, q).
template <typename T>
void pool2d_forward(PoolKind kind, const Pool2dShape& g, const T* x, T* y, std::int64_t* argmax) {
  const std::int64_t planes = g.n * g.c, in_size = g.h * g.w, out_size = g.p * g.q;
  const bool windows_2x2 = max_rows_x2(kind, g, 2), windows_1x2 = max_rows_x2(kind, g, 1);
#pragma omp parallel for schedule(static) if (planes * in_size >= detail::kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    const T* xp = x + plane * in_size;
    if (windows_2x2) {
      max_2x2_plane(g, xp, y + plane * out_size, argmax + plane * out_size);
      continue;
    }
    if (windows_1x2) {
      max_1x2_plane(g, xp, y + plane * out_size, argmax + plane * out_size);
      continue;
    }
    for (std::int64_t i = 0; i < g.p; ++i) {
      const Range rows = window(i, g.stride_h, g.pad_top, g.kernel_h, g.h);
      for (std::int64_t j = 0; j < g.q; ++j) {
        const Range cols = window(j, g.stride_w, g.pad_left, g.kernel_w, g.w);
        const std::int64_t out = plane * out_size + i * g.q + j;
        if (kind == PoolKind::Max) {
          T best = -std::numeric_limits<T>::infinity();
          std::int64_t best_at = rows.begin * g.w + cols.begin;
          for (std::int64_t r = rows.begin; r < rows.end; ++r) {
            for (std::int64_t s = cols.begin; s < cols.end; ++s) {
              if (xp[r * g.w + s] > best) {
                best = xp[r * g.w + s];
                best_at = r * g.w + s;
              }
            }
          }
          y[out] = xp[best_at];
          argmax[out] = best_at;
        } else {
          T sum = 0;
          for (std::int64_t r = rows.begin; r < rows.end; ++r) {
            for (std::int64_t s = cols.begin; s < cols.end; ++s) sum += xp[r * g.w + s];
          }
          y[out] = sum / static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
        }
      }
    }
  }
}

// dy: (n, c, p, q) -> dx: (n, c, h, w). Each plane is owned by one thread, so scatters do not race.
template <typename T>
void pool2d_backward(PoolKind kind, const Pool2dShape& g, const T* dy, T* dx, const std::int64_t* argmax) {
  const std::int64_t planes = g.n * g.c, in_size = g.h * g.w, out_size = g.p * g.q;
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(static) if (planes * in_size >= detail::kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    guard.capture([&] {
      T* dxp = dx + plane * in_size;
      std::fill(dxp, dxp + in_size, T(0));
      for (std::int64_t i = 0; i < g.p; ++i) {
        const Range rows = window(i, g.stride_h, g.pad_top, g.kernel_h, g.h);
        for (std::int64_t j = 0; j < g.q; ++j) {
          const Range cols = window(j, g.stride_w, g.pad_left, g.kernel_w, g.w);
          const std::int64_t out = plane * out_size + i * g.q + j;
          if (kind == PoolKind::Max) {
            const std::int64_t at = argmax[out];
            if (at < 0 || at >= in_size) {
              throw_invalid("pool2d_backward", "argmax value ", at, " is outside [0, ", in_size, ")");
            }
            dxp[at] += dy[out];
          } else {
            const T share = dy[out] / static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
            for (std::int64_t r = rows.begin; r < rows.end; ++r) {
              for (std::int64_t s = cols.begin; s < cols.end; ++s) dxp[r * g.w + s] += share;
            }
          }
        }
      }
    });
  }
  guard.rethrow();
}

// x: (planes, size) -> y: (planes).
template <typename T>
void global_pool_forward(PoolKind kind, const T* x, T* y, std::int64_t* argmax, std::int64_t planes,
                         std::int64_t size) {
#pragma omp parallel for schedule(static) if (planes * size >= detail::kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    const T* xp = x + plane * size;
    if (kind == PoolKind::Max) {
      const std::int64_t at = std::max_element(xp, xp + size) - xp;
      y[plane] = xp[at];
      argmax[plane] = at;
    } else {
      double sum = 0;
      for (std::int64_t e = 0; e < size; ++e) sum += xp[e];
      y[plane] = static_cast<T>(kind == PoolKind::Avg ? sum / static_cast<double>(size) : sum);
    }
  }
}

// dy: (planes) -> dx: (planes, size).
template <typename T>
void global_pool_backward(PoolKind kind, const T* dy, T* dx, const std::int64_t* argmax, std::int64_t planes,
                          std::int64_t size) {
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(static) if (planes * size >= detail::kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    guard.capture([&] {
      T* dxp = dx + plane * size;
      if (kind == PoolKind::Max) {
        const std::int64_t at = argmax[plane];
        if (at < 0 || at >= size) {
          throw_invalid("global_pool_backward", "argmax value ", at, " is outside [0, ", size, ")");
        }
        std::fill(dxp, dxp + size, T(0));
        dxp[at] = dy[plane];
      } else {
        std::fill(dxp, dxp + size, kind == PoolKind::Avg ? dy[plane] / static_cast<T>(size) : dy[plane]);
      }
    });
  }
  guard.rethrow();
}

#define SPARKGRAD_POOL(T)                                                                                      \
  template void pool2d_forward<T>(PoolKind, const Pool2dShape&, const T*, T*, std::int64_t*);                \
  template void pool2d_backward<T>(PoolKind, const Pool2dShape&, const T*, T*, const std::int64_t*);         \
  template void global_pool_forward<T>(PoolKind, const T*, T*, std::int64_t*, std::int64_t, std::int64_t);   \
  template void global_pool_backward<T>(PoolKind, const T*, T*, const std::int64_t*, std::int64_t, std::int64_t);
SPARKGRAD_POOL(float)
SPARKGRAD_POOL(double)

}  // namespace sparkgrad::nn
