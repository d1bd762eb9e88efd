// CUDA twin of cpp/src/nn/conv2d.cpp: im2col + cuBLAS GEMM per image (sparkgrad::gpu::gemm, the same
// row-major call as on the CPU), col2im as a gather (one thread per input element, no atomics), and the
// weight gradient accumulated image by image in one GEMM chain (beta = 1), so it is deterministic.
#include "kernel_util.cuh"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// x_image: (c, h, w) -> col: (c*r*s, p*q); positions outside the image read as zero.
template <typename T>
__global__ void im2col_kernel(Conv2dShape g, const T* x_image, T* col) {
  const std::int64_t pq = g.p * g.q, total = g.c * g.r * g.s * pq;
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) {
    const std::int64_t row = e / pq, oh = (e % pq) / g.q, ow = e % g.q;
    const std::int64_t c = row / (g.r * g.s), r = (row / g.s) % g.r, s = row % g.s;
    const std::int64_t ih = oh * g.stride_h - g.pad_top + r, iw = ow * g.stride_w - g.pad_left + s;
    col[e] = (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? x_image[(c * g.h + ih) * g.w + iw] : T(0);
  }
}

// col: (c*r*s, p*q) -> dx_image: (c, h, w), each element the sum of the column entries that read it.
template <typename T>
__global__ void col2im_kernel(Conv2dShape g, const T* col, T* dx_image) {
  const std::int64_t pq = g.p * g.q, total = g.c * g.h * g.w;
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) {
    const std::int64_t c = e / (g.h * g.w), ih = (e / g.w) % g.h, iw = e % g.w;
    T sum = 0;
    for (std::int64_t r = 0; r < g.r; ++r) {
      const std::int64_t oh_s = ih + g.pad_top - r;  // oh * stride_h
      if (oh_s < 0 || oh_s % g.stride_h != 0 || oh_s / g.stride_h >= g.p) continue;
      for (std::int64_t s = 0; s < g.s; ++s) {
        const std::int64_t ow_s = iw + g.pad_left - s;
        if (ow_s < 0 || ow_s % g.stride_w != 0 || ow_s / g.stride_w >= g.q) continue;
        sum += col[((c * g.r + r) * g.s + s) * pq + (oh_s / g.stride_h) * g.q + ow_s / g.stride_w];
      }
    }
    dx_image[e] = sum;
  }
}

}  // namespace

// x: (n, c, h, w), weights: (k, c*r*s), b: (k) or null -> y: (n, k, p, q).
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y) {
  const char* op = "conv2d_forward";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q;
  if (g.n == 0 || g.k == 0 || pq == 0) return;
  DeviceBuffer<T> col(op, crs * pq);
  for (std::int64_t i = 0; i < g.n; ++i) {
    T* out = y + i * g.k * pq;
    im2col_kernel<<<blocks_for(crs * pq), kThreads>>>(g, x + i * g.c * g.h * g.w, col.get());
    check_kernels(op);
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, g.k, pq, crs, T(1), weights, crs, col.get(), pq, T(0),
                             out, pq);
  }
  // bias_add waits for the queued GEMMs; without a bias wait here, so the call returns once they finished
  if (b) bias_add(y, b, g.n, g.k, pq);
  else check_kernels(op);
}

// dy: (n, k, p, q), weights: (k, c*r*s) -> dx: (n, c, h, w).
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, T* dx) {
  const char* op = "conv2d_backward_input";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, image = g.c * g.h * g.w;
  if (g.n * image == 0) return;
  DeviceBuffer<T> col(op, crs * pq);
  for (std::int64_t i = 0; i < g.n; ++i) {
    sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, crs, pq, g.k, T(1), weights, crs, dy + i * g.k * pq,
                             pq, T(0), col.get(), pq);
    col2im_kernel<<<blocks_for(image), kThreads>>>(g, col.get(), dx + i * image);
    check_kernels(op);
  }
}

// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c*r*s) = sum_i dy_i @ col_i^T.
template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw) {
  const char* op = "conv2d_backward_weight";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q;
  if (g.k * crs == 0) return;
  check_cuda(op, cudaMemset(dw, 0, sizeof(T) * static_cast<std::size_t>(g.k * crs)));
  DeviceBuffer<T> col(op, crs * pq);
  for (std::int64_t i = 0; i < g.n; ++i) {
    im2col_kernel<<<blocks_for(crs * pq), kThreads>>>(g, x + i * g.c * g.h * g.w, col.get());
    check_kernels(op);
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, g.k, crs, pq, T(1), dy + i * g.k * pq, pq, col.get(),
                             pq, T(1), dw, crs);
  }
  check_kernels(op);
}

#define SPARKGRAD_CONV2D(T)                                                                            \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*);             \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*);                \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*);
SPARKGRAD_CONV2D(float)
SPARKGRAD_CONV2D(double)

}  // namespace sparkgrad::nn::cuda
