// 2-D convolution in NCHW through im2col + one OpenBLAS GEMM per chunk of images. The column matrix of a
// chunk of B images is (C*R*S, B*P*Q): image b owns columns [b*P*Q, (b+1)*P*Q), so im2col / col2im run
// in parallel over (image, channel) with no overlap, and the GEMM sees one large problem.
#include <algorithm>
#include <vector>

#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// Upper bound on a chunk's column matrix (elements); at least one image is always processed.
constexpr std::int64_t kMaxColumnElements = std::int64_t{1} << 22;

// Reused per calling thread: training calls conv2d every step with the same shapes.
template <typename T>
T* workspace(int slot, std::int64_t size) {
  thread_local std::vector<T> buffers[2];
  std::vector<T>& buf = buffers[slot];
  if (static_cast<std::int64_t>(buf.size()) < size) buf.resize(static_cast<std::size_t>(size));
  return buf.data();
}

std::int64_t chunk_images(const Conv2dShape& g) {
  const std::int64_t per_image = std::max<std::int64_t>(g.c * g.r * g.s * g.p * g.q, 1);
  return std::clamp<std::int64_t>(kMaxColumnElements / per_image, 1, std::max<std::int64_t>(g.n, 1));
}

// Output columns ow in [lo, hi) read input column ow * stride - pad + s inside [0, size).
void valid_range(std::int64_t s, std::int64_t stride, std::int64_t pad, std::int64_t size, std::int64_t out,
                 std::int64_t* lo, std::int64_t* hi) {
  const std::int64_t shift = pad - s;  // ow * stride >= shift  and  ow * stride < size + shift
  *lo = shift <= 0 ? 0 : (shift + stride - 1) / stride;
  *hi = size + shift <= 0 ? 0 : std::min(out, (size + shift + stride - 1) / stride);
  *lo = std::min(*lo, *hi);
}

// Visits every (column row, output row) pair of image channel c: fn(col_row_ptr, input_row_ptr or null,
// s) with input_row_ptr = null when the output row reads padding only.
template <typename ColPtr, typename XPtr, typename Fn>
void for_each_patch_row(const Conv2dShape& g, std::int64_t c, ColPtr col, std::int64_t ld, XPtr x_image, Fn fn) {
  for (std::int64_t r = 0; r < g.r; ++r) {
    for (std::int64_t s = 0; s < g.s; ++s) {
      const std::int64_t row = (c * g.r + r) * g.s + s;
      for (std::int64_t oh = 0; oh < g.p; ++oh) {
        const std::int64_t ih = oh * g.stride_h - g.pad_top + r;
        const bool inside = ih >= 0 && ih < g.h;
        fn(col + row * ld + oh * g.q, inside ? x_image + (c * g.h + ih) * g.w : nullptr, s);
      }
    }
  }
}

// x_image: (c, h, w) -> columns [0, p*q) of col (row stride ld).
template <typename T>
void im2col_channel(const Conv2dShape& g, std::int64_t c, const T* x_image, T* col, std::int64_t ld) {
  for_each_patch_row(g, c, col, ld, x_image, [&](T* out, const T* in, std::int64_t s) {
    if (!in) return std::fill(out, out + g.q, T(0));
    std::int64_t lo, hi;
    valid_range(s, g.stride_w, g.pad_left, g.w, g.q, &lo, &hi);
    std::fill(out, out + lo, T(0));
    const std::int64_t offset = s - g.pad_left;
    if (g.stride_w == 1) {
      std::copy(in + lo + offset, in + hi + offset, out + lo);
    } else {
      for (std::int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * g.stride_w + offset];
    }
    std::fill(out + hi, out + g.q, T(0));
  });
}

// Accumulates columns [0, p*q) of col back into dx_image: (c, h, w) (already zeroed).
template <typename T>
void col2im_channel(const Conv2dShape& g, std::int64_t c, const T* col, std::int64_t ld, T* dx_image) {
  for_each_patch_row(g, c, col, ld, dx_image, [&](const T* from, T* to, std::int64_t s) {
    if (!to) return;
    std::int64_t lo, hi;
    valid_range(s, g.stride_w, g.pad_left, g.w, g.q, &lo, &hi);
    const std::int64_t offset = s - g.pad_left;
    for (std::int64_t ow = lo; ow < hi; ++ow) to[ow * g.stride_w + offset] += from[ow];
  });
}

// fn(b, k) for every (image, channel) plane of a chunk, in parallel.
template <typename Fn>
void for_each_plane(std::int64_t count, std::int64_t k, Fn fn) {
#pragma omp parallel for collapse(2) schedule(static) if (count * k > 1)
  for (std::int64_t b = 0; b < count; ++b) {
    for (std::int64_t j = 0; j < k; ++j) fn(b, j);
  }
}

// Column matrix of images [first, first + count): (c*r*s, count*p*q).
template <typename T>
void im2col_chunk(const Conv2dShape& g, const T* x, std::int64_t first, std::int64_t count, T* col) {
  const std::int64_t pq = g.p * g.q;
  for_each_plane(count, g.c, [&](std::int64_t b, std::int64_t c) {
    im2col_channel(g, c, x + (first + b) * g.c * g.h * g.w, col + b * pq, count * pq);
  });
}

// Images [first, first + count) of dy: (n, k, p*q) -> matrix: (k, count*p*q).
template <typename T>
void gather_chunk(const Conv2dShape& g, std::int64_t first, std::int64_t count, const T* dy, T* matrix) {
  const std::int64_t pq = g.p * g.q;
  for_each_plane(count, g.k, [&](std::int64_t b, std::int64_t k) {
    const T* from = dy + ((first + b) * g.k + k) * pq;
    std::copy(from, from + pq, matrix + k * count * pq + b * pq);
  });
}

// matrix: (k, count*p*q) plus bias (k, or null) -> images [first, first + count) of y: (n, k, p*q).
template <typename T>
void scatter_chunk(const Conv2dShape& g, std::int64_t first, std::int64_t count, const T* matrix, const T* bias,
                   T* y) {
  const std::int64_t pq = g.p * g.q;
  for_each_plane(count, g.k, [&](std::int64_t b, std::int64_t k) {
    const T* from = matrix + k * count * pq + b * pq;
    T* to = y + ((first + b) * g.k + k) * pq;
    const T add = bias ? bias[k] : T(0);
    for (std::int64_t e = 0; e < pq; ++e) to[e] = from[e] + add;
  });
}

}  // namespace

// x: (n, c, h, w), weights: (k, c*r*s), b: (k) or null -> y: (n, k, p, q).
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y) {
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chunk = chunk_images(g);
  for (std::int64_t first = 0; first < g.n; first += chunk) {
    const std::int64_t count = std::min(chunk, g.n - first);
    T* col = workspace<T>(0, crs * count * pq);
    T* out = workspace<T>(1, g.k * count * pq);
    im2col_chunk(g, x, first, count, col);
    gemm<T>(Transpose::No, Transpose::No, g.k, count * pq, crs, T(1), weights, crs, col, count * pq, T(0), out,
            count * pq);
    scatter_chunk(g, first, count, out, b, y);
  }
}

// dy: (n, k, p, q), weights: (k, c*r*s) -> dx: (n, c, h, w).
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, T* dx) {
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chunk = chunk_images(g), chw = g.c * g.h * g.w;
  for (std::int64_t first = 0; first < g.n; first += chunk) {
    const std::int64_t count = std::min(chunk, g.n - first);
    T* dy_mat = workspace<T>(1, g.k * count * pq);
    T* col = workspace<T>(0, crs * count * pq);
    gather_chunk(g, first, count, dy, dy_mat);
    gemm<T>(Transpose::Yes, Transpose::No, crs, count * pq, g.k, T(1), weights, crs, dy_mat, count * pq, T(0), col,
            count * pq);
    for_each_plane(count, g.c, [&](std::int64_t b, std::int64_t c) {
      T* dx_image = dx + (first + b) * chw;
      std::fill(dx_image + c * g.h * g.w, dx_image + (c + 1) * g.h * g.w, T(0));
      col2im_channel(g, c, col + b * pq, count * pq, dx_image);
    });
  }
}

// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c*r*s), summed over the batch.
template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw) {
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chunk = chunk_images(g);
  if (g.n == 0 || pq == 0) std::fill(dw, dw + g.k * crs, T(0));
  for (std::int64_t first = 0; first < g.n; first += chunk) {
    const std::int64_t count = std::min(chunk, g.n - first);
    T* col = workspace<T>(0, crs * count * pq);
    T* dy_mat = workspace<T>(1, g.k * count * pq);
    im2col_chunk(g, x, first, count, col);
    gather_chunk(g, first, count, dy, dy_mat);
    gemm<T>(Transpose::No, Transpose::Yes, g.k, crs, count * pq, T(1), dy_mat, count * pq, col, count * pq,
            first == 0 ? T(0) : T(1), dw, crs);
  }
}

#define SPARKGRAD_CONV2D(T)                                                                            \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*);             \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*);                \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*);
SPARKGRAD_CONV2D(float)
SPARKGRAD_CONV2D(double)

}  // namespace sparkgrad::nn
