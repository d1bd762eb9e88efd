// LSTM (DL4J's LSTM layer, no peepholes) forward and backward over a whole sequence.
// Per step: z = x_t W + h_{t-1} RW + b; gate blocks of z in DL4J order [block input a, forget f,
// output o, input gate i]; a = act(z_a), f/o/i = gate(z_.); c = f c_{t-1} + i a; h = o act(c).
// A time step with mask m multiplies h and c by m (DL4J: masked steps output zero and restart the
// state from zero).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_util.h"
#include "recurrent_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

LstmSpec parse_lstm_spec(const char* op, const std::string& activation, double alpha, const std::string& gate,
                         double gate_alpha) {
  const LstmSpec spec{parse_activation(op, activation), alpha, parse_activation(op, gate), gate_alpha};
  if (spec.activation == Activation::Softmax || spec.gate == Activation::Softmax) {
    throw_invalid(op, "softmax is not an elementwise activation: not allowed inside an LSTM or a GRU");
  }
  return spec;
}

namespace {

// The forward row below for tanh / sigmoid (DL4J's default) in one loop; kPrev: c_prev is given.
template <bool kPrev, typename T>
SPARKGRAD_FORCE_INLINE void lstm_forward_tanh_sigmoid(std::int64_t h, const T* zr, const T* b, T* z, const T* c_prev,
                                                      T* c_out, T* h_out, T* ac, T m) {
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    const T a = T(1) - T(2) / (T(1) + exp_poly(T(2) * (zr[j] + b[j])));
    const T f = T(1) / (T(1) + exp_poly(-(zr[h + j] + b[h + j])));
    const T o = T(1) / (T(1) + exp_poly(-(zr[2 * h + j] + b[2 * h + j])));
    const T ig = T(1) / (T(1) + exp_poly(-(zr[3 * h + j] + b[3 * h + j])));
    T cell = ig * a;
    if constexpr (kPrev) cell = f * c_prev[j] + ig * a;
    const T act = T(1) - T(2) / (T(1) + exp_poly(T(2) * cell));
    z[j] = a;
    z[h + j] = f;
    z[2 * h + j] = o;
    z[3 * h + j] = ig;
    ac[j] = act;
    h_out[j] = m * o * act;
    c_out[j] = cell * m;
  }
}

// One example's step of the forward: zr = x_t W + h_{t-1} RW (4h, scratch) gets the bias b, then the gates
// z = [a | f | o | i] (4h) are its activations; writes c (masked), act(c) (before the mask) and h.
template <typename T>
SPARKGRAD_FORCE_INLINE void lstm_forward_row_impl(const LstmSpec& spec, std::int64_t h, T* zr, const T* b, T* z,
                                                  const T* c_prev, T* c_out, T* h_out, T* ac, T m) {
  const T alpha = static_cast<T>(spec.alpha), gate_alpha = static_cast<T>(spec.gate_alpha);
  if (spec.activation == Activation::Tanh && spec.gate == Activation::Sigmoid) {
    // DL4J's default cell in one pass per unit (act_block's formulas): short rows (small layers) pay
    // one loop's overhead, not seven, and nothing goes through memory in between.
    if (c_prev != nullptr) {
      lstm_forward_tanh_sigmoid<true>(h, zr, b, z, c_prev, c_out, h_out, ac, m);
    } else {
      lstm_forward_tanh_sigmoid<false>(h, zr, b, z, c_prev, c_out, h_out, ac, m);
    }
    return;
  }
#pragma omp simd
  for (std::int64_t j = 0; j < 4 * h; ++j) zr[j] += b[j];
  act_block(spec.activation, alpha, zr, z, h);
  act_block(spec.gate, gate_alpha, zr + h, z + h, 3 * h);
  const T *a = z, *f = z + h, *o = z + 2 * h, *ig = z + 3 * h;
  if (c_prev != nullptr) {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) c_out[j] = f[j] * c_prev[j] + ig[j] * a[j];
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) c_out[j] = ig[j] * a[j];
  }
  act_block(spec.activation, alpha, c_out, ac, h);
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    h_out[j] = m * o[j] * ac[j];
    c_out[j] *= m;
  }
}
SPARKGRAD_SIMD_CLONES void lstm_forward_row(const LstmSpec& spec, std::int64_t h, float* zr, const float* b,
                                            float* z, const float* c_prev, float* c_out, float* h_out, float* ac,
                                            float m) {
  lstm_forward_row_impl(spec, h, zr, b, z, c_prev, c_out, h_out, ac, m);
}
SPARKGRAD_SIMD_CLONES void lstm_forward_row(const LstmSpec& spec, std::int64_t h, double* zr, const double* b,
                                            double* z, const double* c_prev, double* c_out, double* h_out,
                                            double* ac, double m) {
  lstm_forward_row_impl(spec, h, zr, b, z, c_prev, c_out, h_out, ac, m);
}

// The backward row below for tanh / sigmoid in one loop (act_grad_block's formulas); kPrev: c_prev is given.
template <bool kPrev, typename T>
SPARKGRAD_FORCE_INLINE void lstm_backward_tanh_sigmoid(std::int64_t h, const T* g, const T* ac, const T* c_prev,
                                                       const T* dh_out, T m, T* dz, const T* dh_r, T* dc) {
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    const T a = g[j], f = g[h + j], o = g[2 * h + j], ig = g[3 * h + j], act = ac[j];
    const T dh_t = m * (dh_out[j] + dh_r[j]);
    const T dc_t = m * dc[j] + dh_t * o * (T(1) - act * act);
    dz[j] = dc_t * ig * (T(1) - a * a);
    if constexpr (kPrev) {
      dz[h + j] = dc_t * c_prev[j] * (f * (T(1) - f));
    } else {
      dz[h + j] = T(0);
    }
    dz[2 * h + j] = dh_t * act * (o * (T(1) - o));
    dz[3 * h + j] = dc_t * a * (ig * (T(1) - ig));
    dc[j] = dc_t * f;
  }
}

// One example's step of the backward: from the activated gates g (4h), act(c) and c_prev (null: zero),
// the output gradient dh_out and the gradients reaching h_t (dh_r) and c_t (dc) through step t+1,
// writes dz (4h) and replaces dc with the gradient reaching c_{t-1}. deriv: 5h scratch.
template <typename T>
SPARKGRAD_FORCE_INLINE void lstm_backward_row_impl(const LstmSpec& spec, std::int64_t h, const T* g, const T* ac,
                                                   const T* c_prev, const T* dh_out, T m, T* dz, const T* dh_r,
                                                   T* dc, T* deriv) {
  if (spec.activation == Activation::Tanh && spec.gate == Activation::Sigmoid) {  // one pass, as the forward
    if (c_prev != nullptr) {
      lstm_backward_tanh_sigmoid<true>(h, g, ac, c_prev, dh_out, m, dz, dh_r, dc);
    } else {
      lstm_backward_tanh_sigmoid<false>(h, g, ac, c_prev, dh_out, m, dz, dh_r, dc);
    }
    return;
  }
  const T alpha = static_cast<T>(spec.alpha), gate_alpha = static_cast<T>(spec.gate_alpha);
  T* d_a = deriv;
  T* d_ac = d_a + h;
  T* d_f = d_ac + h;
  T* d_o = d_f + h;
  T* d_i = d_o + h;
  act_grad_block(spec.activation, alpha, g, d_a, h);
  act_grad_block(spec.activation, alpha, ac, d_ac, h);
  act_grad_block(spec.gate, gate_alpha, g + h, d_f, 3 * h);
  const T *a = g, *f = g + h, *o = g + 2 * h, *ig = g + 3 * h;
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    const T dh_t = m * (dh_out[j] + dh_r[j]);
    const T dc_t = m * dc[j] + dh_t * o[j] * d_ac[j];
    dz[j] = dc_t * ig[j] * d_a[j];
    dz[h + j] = c_prev != nullptr ? dc_t * c_prev[j] * d_f[j] : T(0);
    dz[2 * h + j] = dh_t * ac[j] * d_o[j];
    dz[3 * h + j] = dc_t * a[j] * d_i[j];
    dc[j] = dc_t * f[j];
  }
}
SPARKGRAD_SIMD_CLONES void lstm_backward_row(const LstmSpec& spec, std::int64_t h, const float* g, const float* ac,
                                             const float* c_prev, const float* dh_out, float m, float* dz,
                                             const float* dh_r, float* dc, float* deriv) {
  lstm_backward_row_impl(spec, h, g, ac, c_prev, dh_out, m, dz, dh_r, dc, deriv);
}
SPARKGRAD_SIMD_CLONES void lstm_backward_row(const LstmSpec& spec, std::int64_t h, const double* g,
                                             const double* ac, const double* c_prev, const double* dh_out,
                                             double m, double* dz, const double* dh_r, double* dc, double* deriv) {
  lstm_backward_row_impl(spec, h, g, ac, c_prev, dh_out, m, dz, dh_r, dc, deriv);
}

}  // namespace

template <typename T>
void lstm_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                  const T* mask, const T* h0, const T* c0, T* hs, T* cs, T* gates, T* act_c) {
  const std::int64_t n = s.n, t_len = s.t, c = s.c, h = s.h, g4 = 4 * s.h, kx = c + h;
  // Each step is one product [x_t | h_{t-1}] [W; RW] into a small (n, 4h) scratch that stays in cache;
  // the step's rows then add the bias and write their activated gates into the (n, t, 4h) buffer (larger
  // than the caches for big layers) once. No GEMM over all steps writes the input projection there first:
  // with a small input size that one ran far below the per-step products' rate, and its output went
  // through memory twice more.
  const FixedOperandGemm<T> step_product(n, c, h, g4, w, g4, rw, g4);
  std::unique_ptr<T[]> xh(new T[static_cast<std::size_t>(n * kx)]);  // [x_t | h_{t-1}], row i: example i
  std::unique_ptr<T[]> zr(new T[static_cast<std::size_t>(n * g4)]);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy(x + i * t_len * c, x + i * t_len * c + c, xh.get() + i * kx);
    if (h0 != nullptr) std::copy(h0 + i * h, h0 + (i + 1) * h, xh.get() + i * kx + c);
  }
  for (std::int64_t t = 0; t < t_len; ++t) {
    if (t > 0 || h0 != nullptr) {
      step_product.multiply(xh.get(), kx, T(0), zr.get(), g4);
    } else {  // the first step from a zero state: x_0 W
      gemm<T>(Transpose::No, Transpose::No, n, g4, c, T(1), xh.get(), kx, w, g4, T(0), zr.get(), g4);
    }
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;  // rows of step t are strided by t_len in the (n, t, .) layout
      const T* c_prev = t > 0 ? cs + (row - 1) * h : (c0 != nullptr ? c0 + i * h : nullptr);
      lstm_forward_row(spec, h, zr.get() + i * g4, b, gates + row * g4, c_prev, cs + row * h, hs + row * h,
                       act_c + row * h, mask != nullptr ? mask[row] : T(1));
      if (t + 1 < t_len) {  // the next step's [x_{t+1} | h_t]
        T* dst = xh.get() + i * kx;
        std::copy(x + (row + 1) * c, x + (row + 2) * c, dst);
        std::copy(hs + row * h, hs + (row + 1) * h, dst + c);
      }
    }
  }
}

template <typename T>
void lstm_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                   const T* h0, const T* c0, const T* hs, const T* cs, const T* gates, const T* act_c, const T* dh,
                   T* dgates, T* dx, T* dw, T* drw, T* db, std::int64_t first_step) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, g4 = 4 * s.h;
  std::vector<T> dh_rec(static_cast<std::size_t>(n * h), T(0));  // dL/dh_t through step t+1
  std::vector<T> dc_next(static_cast<std::size_t>(n * h), T(0));  // dL/dc_t through step t+1
  for (std::int64_t i = 0; i < n; ++i) {  // truncated steps get no gradient
    std::fill(dgates + i * t_len * g4, dgates + (i * t_len + first_step) * g4, T(0));
  }
  const FixedOperandGemm<T> recurrent_t(Transpose::Yes, n, g4, h, rw, g4);
  for (std::int64_t t = t_len - 1; t >= first_step; --t) {
    if (t < t_len - 1) recurrent_t.multiply(dgates + (t + 1) * g4, t_len * g4, T(0), dh_rec.data(), h);  // dz RW^T
    T* dh_rec_p = dh_rec.data();
    T* dc_p = dc_next.data();
#pragma omp parallel if (n * h >= kGateParallelMin)
    {
      std::vector<T> deriv(static_cast<std::size_t>(5 * h));  // f'(a), f'(act_c), gate'(f, o, i)
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t row = i * t_len + t;
        const T* c_prev = t > 0 ? cs + (row - 1) * h : (c0 != nullptr ? c0 + i * h : nullptr);
        lstm_backward_row(spec, h, gates + row * g4, act_c + row * h, c_prev, dh + row * h,
                          mask != nullptr ? mask[row] : T(1), dgates + row * g4, dh_rec_p + i * h, dc_p + i * h,
                          deriv.data());
      }
    }
  }
  // All the parameter gradients with one GEMM over all time steps when they lie one after another as W, RW,
  // b do in the layer's flat gradient: [dW; dRW; db] = [x | h_prev | 1]^T dZ, h_prev (n, t, h) the state
  // each step started from. One product with c + h + 1 rows, not one with c (a small input size ran it far
  // below the GEMM's rate), one with h and a pass of column sums over dZ, which is larger than the caches for
  // big layers. Separate buffers (the kernel's tests) get one product each and the column sums.
  const bool in_place = drw == dw + s.c * g4 && db == drw + h * g4;
  const std::int64_t kx = s.c + h + (in_place ? 1 : 0);
  std::unique_ptr<T[]> xh(new T[static_cast<std::size_t>(n * t_len * kx)]);  // every value is written
  previous_inputs_and_states(s, x, hs, h0, xh.get(), in_place);
  if (in_place) {
    gemm<T>(Transpose::Yes, Transpose::No, kx, g4, n * t_len, T(1), xh.get(), kx, dgates, g4, T(0), dw, g4);
  } else {
    gemm<T>(Transpose::Yes, Transpose::No, s.c, g4, n * t_len, T(1), xh.get(), kx, dgates, g4, T(0), dw, g4);
    gemm<T>(Transpose::Yes, Transpose::No, h, g4, n * t_len, T(1), xh.get() + s.c, kx, dgates, g4, T(0), drw, g4);
    column_sums(dgates, n * t_len, g4, db);
  }
  if (dx != nullptr) {
    gemm<T>(Transpose::No, Transpose::Yes, n * t_len, s.c, g4, T(1), dgates, g4, w, g4, T(0), dx, s.c);
  }
}

#define SPARKGRAD_LSTM(T)                                                                                          \
  template void lstm_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,        \
                                const T*, const T*, const T*, T*, T*, T*, T*);                                    \
  template void lstm_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,       \
                                 const T*, const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                                 T*, T*, std::int64_t);
SPARKGRAD_LSTM(float)
SPARKGRAD_LSTM(double)

}  // namespace sparkgrad::nn
