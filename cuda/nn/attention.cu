// CUDA twin of cpp/src/nn/attention.cpp: each head's products as one strided-batched cuBLAS GEMM over the
// examples (the heads stay interleaved in the feature axis: row strides heads * d), the masked softmax and
// its backward one block per row of weights.
#include <cmath>

#include "kernel_util.cuh"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// Maximum of `value` over the block (blockDim.x == kThreads), returned to every thread.
template <typename A>
__device__ A block_max(A value) {
  __shared__ A partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width >>= 1) {
    if (threadIdx.x < width) partial[threadIdx.x] = max(partial[threadIdx.x], partial[threadIdx.x + width]);
    __syncthreads();
  }
  const A total = partial[0];
  __syncthreads();
  return total;
}

// Row `blockIdx.x` of weights (n * heads * tq rows of tk scores): softmax over the keys whose mask value is
// non-zero; masked keys 0, a row without a present key all zeros (as the CPU).
template <typename T>
__global__ void masked_softmax_kernel(T* weights, const T* mask, std::int64_t rows_per_example, std::int64_t tk) {
  const std::int64_t r = blockIdx.x;
  T* row = weights + r * tk;
  const T* m = mask == nullptr ? nullptr : mask + (r / rows_per_example) * tk;
  double top = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    if (m == nullptr || m[c] != T(0)) top = max(top, static_cast<double>(row[c]));
  }
  top = block_max(top);
  if (top == -INFINITY) {
    for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) row[c] = T(0);
    return;
  }
  const T t_top = static_cast<T>(top);
  double sum = 0;
  for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    const T e = (m == nullptr || m[c] != T(0)) ? static_cast<T>(exp(row[c] - t_top)) : T(0);
    row[c] = e;
    sum += e;
  }
  sum = block_sum(sum);
  const T inv = static_cast<T>(1.0 / sum);
  for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) row[c] *= inv;
}

// dS = scale w (dw - <dw, w>) for row blockIdx.x, in place in dw.
template <typename T>
__global__ void softmax_backward_kernel(const T* weights, T* dweights, std::int64_t tk, double scale) {
  const std::int64_t r = blockIdx.x;
  const T* w = weights + r * tk;
  T* d = dweights + r * tk;
  double dot = 0;
  for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) dot += static_cast<double>(w[c]) * d[c];
  dot = block_sum(dot);
  const T tdot = static_cast<T>(dot), tscale = static_cast<T>(scale);
  for (std::int64_t c = threadIdx.x; c < tk; c += blockDim.x) d[c] = tscale * w[c] * (d[c] - tdot);
}

}  // namespace

template <typename T>
void attention_forward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* mask, double scale,
                       T* weights, T* y) {
  const std::int64_t hd = s.heads * s.d, hdv = s.heads * s.dv, plane = s.tq * s.tk, rows = s.n * s.heads * s.tq;
  if (rows == 0) return;
  for (std::int64_t j = 0; j < s.heads; ++j) {
    gpu::gemm_strided_batched<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.d, static_cast<T>(scale), q + j * s.d,
                                 hd, s.tq * hd, k + j * s.d, hd, s.tk * hd, T(0), weights + j * plane, s.tk,
                                 s.heads * plane, s.n);
  }
  masked_softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, gpu::current_stream()>>>(weights, mask,
                                                                                             s.heads * s.tq, s.tk);
  check_kernels("attention_forward");
  for (std::int64_t j = 0; j < s.heads; ++j) {
    gpu::gemm_strided_batched<T>(Transpose::No, Transpose::No, s.tq, s.dv, s.tk, T(1), weights + j * plane, s.tk,
                                 s.heads * plane, v + j * s.dv, hdv, s.tk * hdv, T(0), y + j * s.dv, hdv,
                                 s.tq * hdv, s.n);
  }
}

template <typename T>
void attention_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* weights, const T* dy,
                        double scale, T* dweights, T* dq, T* dk, T* dv) {
  const std::int64_t hd = s.heads * s.d, hdv = s.heads * s.dv, plane = s.tq * s.tk, rows = s.n * s.heads * s.tq;
  if (rows == 0) return;
  for (std::int64_t j = 0; j < s.heads; ++j) {
    gpu::gemm_strided_batched<T>(Transpose::No, Transpose::Yes, s.tq, s.tk, s.dv, T(1), dy + j * s.dv, hdv,
                                 s.tq * hdv, v + j * s.dv, hdv, s.tk * hdv, T(0), dweights + j * plane, s.tk,
                                 s.heads * plane, s.n);
    gpu::gemm_strided_batched<T>(Transpose::Yes, Transpose::No, s.tk, s.dv, s.tq, T(1), weights + j * plane, s.tk,
                                 s.heads * plane, dy + j * s.dv, hdv, s.tq * hdv, T(0), dv + j * s.dv, hdv,
                                 s.tk * hdv, s.n);
  }
  softmax_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, gpu::current_stream()>>>(weights, dweights,
                                                                                               s.tk, scale);
  check_kernels("attention_backward");
  for (std::int64_t j = 0; j < s.heads; ++j) {
    gpu::gemm_strided_batched<T>(Transpose::No, Transpose::No, s.tq, s.d, s.tk, T(1), dweights + j * plane, s.tk,
                                 s.heads * plane, k + j * s.d, hd, s.tk * hd, T(0), dq + j * s.d, hd, s.tq * hd,
                                 s.n);
    gpu::gemm_strided_batched<T>(Transpose::Yes, Transpose::No, s.tk, s.d, s.tq, T(1), dweights + j * plane, s.tk,
                                 s.heads * plane, q + j * s.d, hd, s.tq * hd, T(0), dk + j * s.d, hd, s.tk * hd,
                                 s.n);
  }
}

#define SPARKGRAD_ATTENTION(T)                                                                                 \
  template void attention_forward<T>(const AttentionShape&, const T*, const T*, const T*, const T*, double, T*, \
                                     T*);                                                                      \
  template void attention_backward<T>(const AttentionShape&, const T*, const T*, const T*, const T*, const T*, \
                                      double, T*, T*, T*, T*);
SPARKGRAD_ATTENTION(float)
SPARKGRAD_ATTENTION(double)

}  // namespace sparkgrad::nn::cuda
