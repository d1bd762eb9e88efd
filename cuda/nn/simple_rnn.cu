// CUDA twin of cpp/src/nn/simple_rnn.cpp (DL4J's SimpleRnn: h_t = m_t * activation(x_t W + h_{t-1} RW + b),
// a masked step outputs zero and the next starts from a zero state). Forward: the bias broadcast into every
// row, the input projection of all steps in one cuBLAS GEMM, then per step one recurrent GEMM and one fused
// kernel for the activation and the mask. Backward: per step one GEMM (dz_{t+1} RW^T) and one fused kernel
// (mask, derivative from the outputs), then one GEMM per weight gradient over all steps; db sums the rows in
// double in the CPU's order. Softmax normalizes each example's row of h values, one thread per row. The
// kernels and GEMMs of one call queue on the calling thread's stream and the call returns without waiting.
#include "activation.cuh"
#include "kernel_util.cuh"
#include "recurrent_util.cuh"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;
using device::forward_value;
using device::grad_from_output;
using device::softmax_backward_row;
using device::softmax_row;

// Step t, one thread per (example i, unit j): act[i, t] holds the pre-activation, replaced by its
// activation; hs[i, t] = mask[i, t] * act[i, t]. hs, act: (n, t, h); mask: (n, t) or null.
template <typename T>
__global__ void forward_step_kernel(Activation kind, T alpha, LstmShape s, std::int64_t t, const T* mask, T* hs,
                                    T* act) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t row = (e / h) * s.t + t, at = row * h + e % h;
    const T a = forward_value(kind, alpha, act[at]);
    act[at] = a;
    hs[at] = (mask != nullptr ? mask[row] : T(1)) * a;
  }
}

// The same step for softmax, one thread per example: the row of h pre-activations normalized in place.
template <typename T>
__global__ void softmax_forward_step_kernel(LstmShape s, std::int64_t t, const T* mask, T* hs, T* act) {
  const std::int64_t h = s.h;
  for (std::int64_t i = first_index(); i < s.n; i += grid_stride()) {
    const std::int64_t row = i * s.t + t;
    T* a = act + row * h;
    softmax_row(a, a, h);
    const T m = mask != nullptr ? mask[row] : T(1);
    for (std::int64_t j = 0; j < h; ++j) hs[row * h + j] = m * a[j];
  }
}

// Backward of step t, one thread per (i, j): dz[i, t] = m * (dz_{t+1} RW^T, already in dz[i, t] when
// has_next, + dh[i, t]) * f'(.) from the output act. dz, dh, act: (n, t, h).
template <typename T>
__global__ void backward_step_kernel(Activation kind, T alpha, LstmShape s, std::int64_t t, bool has_next,
                                     const T* mask, const T* act, const T* dh, T* dz) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t row = (e / h) * s.t + t, at = row * h + e % h;
    const T m = mask != nullptr ? mask[row] : T(1);
    const T g = has_next ? dz[at] + dh[at] : dh[at];
    dz[at] = m * g * grad_from_output(kind, alpha, act[at]);
  }
}

// The same step for softmax, one thread per example row.
template <typename T>
__global__ void softmax_backward_step_kernel(LstmShape s, std::int64_t t, bool has_next, const T* mask,
                                             const T* act, const T* dh, T* dz) {
  const std::int64_t h = s.h;
  for (std::int64_t i = first_index(); i < s.n; i += grid_stride()) {
    const std::int64_t row = i * s.t + t;
    const T m = mask != nullptr ? mask[row] : T(1);
    T* d = dz + row * h;
    const T* g = dh + row * h;
    for (std::int64_t j = 0; j < h; ++j) d[j] = m * (has_next ? d[j] + g[j] : g[j]);
    softmax_backward_row(act + row * h, d, d, h);
  }
}

}  // namespace

// x: (n, t, c); w: (c, h); rw: (h, h); b: (h); mask: (n, t) or null; h0: (n, h) or null; hs, act: (n, t, h).
template <typename T>
void simple_rnn_forward(Activation kind, double alpha_in, const LstmShape& s, const T* x, const T* w, const T* rw,
                        const T* b, const T* mask, const T* h0, T* hs, T* act) {
  const char* op = "simple_rnn_forward";
  const std::int64_t rows = s.n * s.t, h = s.h, ld = s.t * s.h;
  if (rows == 0 || h == 0) return;
  const T alpha = static_cast<T>(alpha_in);
  const cudaStream_t stream = gpu::current_stream();
  broadcast_bias_kernel<<<blocks_for(rows * h), kThreads, 0, stream>>>(b, act, rows, h);
  check_cuda(op, cudaGetLastError());
  if (s.c > 0) {  // act += x W for every step
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, rows, h, s.c, T(1), x, s.c, w, h, T(1), act, h);
  }
  for (std::int64_t t = 0; t < s.t; ++t) {
    // act[:, t] += h_{t-1} RW; rows of step t are strided by ld in the (n, t, h) layout.
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    if (h_prev != nullptr) {
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, s.n, h, h, T(1), h_prev, t > 0 ? ld : h, rw, h, T(1),
                              act + t * h, ld);
    }
    if (kind == Activation::Softmax) {
      softmax_forward_step_kernel<<<blocks_for(s.n), kThreads, 0, stream>>>(s, t, mask, hs, act);
    } else {
      forward_step_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(kind, alpha, s, t, mask, hs, act);
    }
    check_cuda(op, cudaGetLastError());
  }
  check_kernels(op);
}

// Outputs of simple_rnn_forward plus dh: (n, t, h) -> dz: (n, t, h), dx: (n, t, c) or null, dw: (c, h),
// drw: (h, h), db: (h); steps before first_step get no gradient.
template <typename T>
void simple_rnn_backward(Activation kind, double alpha_in, const LstmShape& s, const T* x, const T* w,
                         const T* rw, const T* mask, const T* h0, const T* hs, const T* act, const T* dh, T* dz,
                         T* dx, T* dw, T* drw, T* db, std::int64_t first_step) {
  const char* op = "simple_rnn_backward";
  const std::int64_t rows = s.n * s.t, h = s.h, ld = s.t * s.h;
  if (rows == 0 || h == 0) return;
  const T alpha = static_cast<T>(alpha_in);
  const cudaStream_t stream = gpu::current_stream();
  if (first_step > 0) {  // truncated steps: the first first_step rows of every example
    const std::size_t row_bytes = sizeof(T) * static_cast<std::size_t>(h);
    check_cuda(op, cudaMemset2DAsync(dz, row_bytes * static_cast<std::size_t>(s.t), 0,
                                     row_bytes * static_cast<std::size_t>(first_step), static_cast<std::size_t>(s.n),
                                     stream));
  }
  for (std::int64_t t = s.t - 1; t >= first_step; --t) {
    const bool has_next = t < s.t - 1;
    if (has_next) {  // dz[:, t] = dz[:, t+1] RW^T: the gradient reaching h_t through step t+1
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, s.n, h, h, T(1), dz + (t + 1) * h, ld, rw, h, T(0),
                              dz + t * h, ld);
    }
    if (kind == Activation::Softmax) {
      softmax_backward_step_kernel<<<blocks_for(s.n), kThreads, 0, stream>>>(s, t, has_next, mask, act, dh, dz);
    } else {
      backward_step_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(kind, alpha, s, t, has_next, mask, act, dh,
                                                                         dz);
    }
    check_cuda(op, cudaGetLastError());
  }
  // Weight gradients with one GEMM each over all steps: dW = x^T dZ, dRW = h_prev^T dZ.
  if (s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, s.c, h, rows, T(1), x, s.c, dz, h, T(0), dw, h);
  }
  DeviceBuffer<T> h_prev(op, rows * h);
  previous_h_kernel<<<blocks_for(rows * h), kThreads, 0, stream>>>(s, hs, h0, h_prev.get());
  check_cuda(op, cudaGetLastError());
  sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, h, h, rows, T(1), h_prev.get(), h, dz, h, T(0), drw, h);
  channel_sums(op, dz, db, rows, h, std::int64_t{1});  // column sums of dz: (rows, h)
  if (dx != nullptr && s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, rows, s.c, h, T(1), dz, h, w, h, T(0), dx, s.c);
  }
  check_kernels(op);
}

#define SPARKGRAD_SIMPLE_RNN(T)                                                                                 \
  template void simple_rnn_forward<T>(Activation, double, const LstmShape&, const T*, const T*, const T*,        \
                                      const T*, const T*, const T*, T*, T*);                                     \
  template void simple_rnn_backward<T>(Activation, double, const LstmShape&, const T*, const T*, const T*,       \
                                       const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*,     \
                                       std::int64_t);
SPARKGRAD_SIMPLE_RNN(float)
SPARKGRAD_SIMPLE_RNN(double)

}  // namespace sparkgrad::nn::cuda
