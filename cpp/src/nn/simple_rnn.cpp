// SimpleRnn (DL4J's SimpleRnn layer) forward and backward over a whole sequence:
// h_t = m_t * activation(x_t W + h_{t-1} RW + b), with m_t the step's mask value (DL4J: a masked step
// outputs zero and the next step starts from a zero state). One GEMM projects the input of every step,
// then each step is one recurrent GEMM and one fused pass over its rows.
#include <algorithm>
#include <memory>
#include <vector>

#include "recurrent_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// One example's step of the forward: a = activation(a + zx + b) in place (a holds h_{t-1} RW, or nothing
// when has_prev is false), then out = m * a (out holds x_t W until then).
template <typename T>
SPARKGRAD_FORCE_INLINE void forward_row_impl(Activation kind, T alpha, std::int64_t h, const T* b, bool has_prev,
                                             T* a, T* out, T m) {
  if (has_prev) {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) a[j] += out[j] + b[j];
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) a[j] = out[j] + b[j];
  }
  if (kind == Activation::Softmax) {
    activation_forward<T>(kind, alpha, a, a, 1, h);
  } else {
    act_block(kind, alpha, a, a, h);
  }
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) out[j] = m * a[j];
}
SPARKGRAD_SIMD_CLONES void forward_row(Activation kind, float alpha, std::int64_t h, const float* b, bool has_prev,
                                       float* a, float* out, float m) {
  forward_row_impl(kind, alpha, h, b, has_prev, a, out, m);
}
SPARKGRAD_SIMD_CLONES void forward_row(Activation kind, double alpha, std::int64_t h, const double* b,
                                       bool has_prev, double* a, double* out, double m) {
  forward_row_impl(kind, alpha, h, b, has_prev, a, out, m);
}

// One example's step of the backward: d = m * (d + g) (d holds dz_{t+1} RW^T, or nothing when has_next is
// false; g = dL/dh_t from the layer above), then times activation'(.) written in terms of y.
template <typename T>
SPARKGRAD_FORCE_INLINE void backward_row_impl(Activation kind, T alpha, std::int64_t h, const T* y, const T* g,
                                              bool has_next, T* d, T m) {
  if (has_next) {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) d[j] = m * (d[j] + g[j]);
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) d[j] = m * g[j];
  }
  if (kind == Activation::Softmax) {
    activation_backward<T>(kind, alpha, y, y, d, d, 1, h);
  } else {
    act_grad_mul(kind, alpha, y, d, h);
  }
}
SPARKGRAD_SIMD_CLONES void backward_row(Activation kind, float alpha, std::int64_t h, const float* y,
                                        const float* g, bool has_next, float* d, float m) {
  backward_row_impl(kind, alpha, h, y, g, has_next, d, m);
}
SPARKGRAD_SIMD_CLONES void backward_row(Activation kind, double alpha, std::int64_t h, const double* y,
                                        const double* g, bool has_next, double* d, double m) {
  backward_row_impl(kind, alpha, h, y, g, has_next, d, m);
}

}  // namespace

template <typename T>
void simple_rnn_forward(Activation kind, double alpha_in, const LstmShape& s, const T* x, const T* w, const T* rw,
                        const T* b, const T* mask, const T* h0, T* hs, T* act) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, ld = s.t * s.h;
  const T alpha = static_cast<T>(alpha_in);
  // x W for every step, parked in hs: step t reads its rows before it overwrites them with its output.
  gemm<T>(Transpose::No, Transpose::No, n * t_len, h, s.c, T(1), x, s.c, w, h, T(0), hs, h);
  const FixedOperandGemm<T> recurrent(Transpose::No, n, h, h, rw, h);
  for (std::int64_t t = 0; t < t_len; ++t) {
    // act[:, t] = h_{t-1} RW; rows of step t are strided by ld in the (n, t, h) layout.
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    if (h_prev != nullptr) recurrent.multiply(h_prev, t > 0 ? ld : h, T(0), act + t * h, ld);
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      forward_row(kind, alpha, h, b, h_prev != nullptr, act + i * ld + t * h, hs + i * ld + t * h,
                  mask != nullptr ? mask[i * t_len + t] : T(1));
    }
  }
}

template <typename T>
void simple_rnn_backward(Activation kind, double alpha_in, const LstmShape& s, const T* x, const T* w,
                         const T* rw, const T* mask, const T* h0, const T* hs, const T* act, const T* dh, T* dz,
                         T* dx, T* dw, T* drw, T* db, std::int64_t first_step) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, ld = s.t * s.h;
  const T alpha = static_cast<T>(alpha_in);
  for (std::int64_t i = 0; i < n; ++i) {  // truncated steps get no gradient
    std::fill(dz + i * ld, dz + i * ld + first_step * h, T(0));
  }
  const FixedOperandGemm<T> recurrent_t(Transpose::Yes, n, h, h, rw, h);
  for (std::int64_t t = t_len - 1; t >= first_step; --t) {
    const bool has_next = t < t_len - 1;
    if (has_next) {  // dz[:, t] = dz[:, t+1] RW^T: the gradient reaching h_t through step t+1
      recurrent_t.multiply(dz + (t + 1) * h, ld, T(0), dz + t * h, ld);
    }
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t off = i * ld + t * h;
      backward_row(kind, alpha, h, act + off, dh + off, has_next, dz + off,
                   mask != nullptr ? mask[i * t_len + t] : T(1));
    }
  }
  // Weight gradients with one GEMM each over all steps: dW = x^T dZ, dRW = h_prev^T dZ.
  gemm<T>(Transpose::Yes, Transpose::No, s.c, h, n * t_len, T(1), x, s.c, dz, h, T(0), dw, h);
  // h_prev (n, t, h): the state each step started from (h0 or zero at step 0); uninitialized storage,
  // every value is written.
  std::unique_ptr<T[]> h_prev(new T[static_cast<std::size_t>(n * ld)]);
  previous_states(s, hs, h0, h_prev.get());
  gemm<T>(Transpose::Yes, Transpose::No, h, h, n * t_len, T(1), h_prev.get(), h, dz, h, T(0), drw, h);
  column_sums(dz, n * t_len, h, db);
  if (dx != nullptr) {
    gemm<T>(Transpose::No, Transpose::Yes, n * t_len, s.c, h, T(1), dz, h, w, h, T(0), dx, s.c);
  }
}

#define SPARKGRAD_SIMPLE_RNN(T)                                                                                 \
  template void simple_rnn_forward<T>(Activation, double, const LstmShape&, const T*, const T*, const T*,        \
                                      const T*, const T*, const T*, T*, T*);                                     \
  template void simple_rnn_backward<T>(Activation, double, const LstmShape&, const T*, const T*, const T*,       \
                                       const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*,     \
                                       std::int64_t);
SPARKGRAD_SIMPLE_RNN(float)
SPARKGRAD_SIMPLE_RNN(double)

}  // namespace sparkgrad::nn
