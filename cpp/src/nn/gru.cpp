// GRU (libnd4j's gru / gruCell, the recurrent cell DL4J runs) forward and backward over a whole sequence.
// Per step: gate blocks [reset r, update u, candidate c] of z = x_t W + b (3h columns);
// r = gate(z_r + h_{t-1} RW_r), u = gate(z_u + h_{t-1} RW_u), c = act(z_c + (r h_{t-1}) RW_c),
// h = u h_{t-1} + (1 - u) c. The reset gate acts before the recurrent product of the candidate (the
// original GRU, Keras's reset_after=False), so each step is two recurrent GEMMs: [r | u], then c.
// A time step with mask m multiplies h by m (as the LSTM: a masked step outputs zero and the next step
// starts from a zero state).
#include <algorithm>
#include <memory>
#include <vector>

#include "recurrent_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// One example's gates r and u: z (2h, holding x W + b + h_prev RW_ru) activated in place; rh = r h_prev
// (h_prev null: zero state, rh = 0).
template <typename T>
SPARKGRAD_FORCE_INLINE void gru_gates_row_impl(const LstmSpec& spec, std::int64_t h, T* z, const T* h_prev, T* rh) {
  act_block(spec.gate, static_cast<T>(spec.gate_alpha), z, z, 2 * h);
  if (h_prev != nullptr) {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) rh[j] = z[j] * h_prev[j];
  }
}
SPARKGRAD_SIMD_CLONES void gru_gates_row(const LstmSpec& spec, std::int64_t h, float* z, const float* h_prev,
                                         float* rh) {
  gru_gates_row_impl(spec, h, z, h_prev, rh);
}
SPARKGRAD_SIMD_CLONES void gru_gates_row(const LstmSpec& spec, std::int64_t h, double* z, const double* h_prev,
                                         double* rh) {
  gru_gates_row_impl(spec, h, z, h_prev, rh);
}

// One example's candidate and output: zc (h, holding x W_c + b_c + rh RW_c) activated in place to c, then
// h_out = m (u h_prev + (1 - u) c).
template <typename T>
SPARKGRAD_FORCE_INLINE void gru_output_row_impl(const LstmSpec& spec, std::int64_t h, const T* u, T* zc,
                                                const T* h_prev, T* h_out, T m) {
  act_block(spec.activation, static_cast<T>(spec.alpha), zc, zc, h);
  if (h_prev != nullptr) {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) h_out[j] = m * (u[j] * h_prev[j] + (T(1) - u[j]) * zc[j]);
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) h_out[j] = m * ((T(1) - u[j]) * zc[j]);
  }
}
SPARKGRAD_SIMD_CLONES void gru_output_row(const LstmSpec& spec, std::int64_t h, const float* u, float* zc,
                                          const float* h_prev, float* h_out, float m) {
  gru_output_row_impl(spec, h, u, zc, h_prev, h_out, m);
}
SPARKGRAD_SIMD_CLONES void gru_output_row(const LstmSpec& spec, std::int64_t h, const double* u, double* zc,
                                          const double* h_prev, double* h_out, double m) {
  gru_output_row_impl(spec, h, u, zc, h_prev, h_out, m);
}

// First half of one example's backward step. d (h) holds the gradient reaching h_t through step t+1 (zero
// at the last step); with the output gradient g, dh = m (d + g) is dL/dh_t before the mask. Writes dz_u and
// dz_c into dz (3h: [r | u | c]) and replaces d with dh u (the part of dL/dh_{t-1} that skips the gates).
template <typename T>
SPARKGRAD_FORCE_INLINE void gru_backward_out_row_impl(const LstmSpec& spec, std::int64_t h, const T* gates,
                                                      const T* h_prev, const T* g, T* d, T* dz, T m) {
  const T *u = gates + h, *c = gates + 2 * h;
  T *dzu = dz + h, *dzc = dz + 2 * h;
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    const T dj = m * (d[j] + g[j]);
    dzu[j] = h_prev != nullptr ? dj * (h_prev[j] - c[j]) : -dj * c[j];
    dzc[j] = dj * (T(1) - u[j]);
    d[j] = dj * u[j];
  }
  act_grad_mul(spec.gate, static_cast<T>(spec.gate_alpha), u, dzu, h);
  act_grad_mul(spec.activation, static_cast<T>(spec.alpha), c, dzc, h);
}
SPARKGRAD_SIMD_CLONES void gru_backward_out_row(const LstmSpec& spec, std::int64_t h, const float* gates,
                                                const float* h_prev, const float* g, float* d, float* dz,
                                                float m) {
  gru_backward_out_row_impl(spec, h, gates, h_prev, g, d, dz, m);
}
SPARKGRAD_SIMD_CLONES void gru_backward_out_row(const LstmSpec& spec, std::int64_t h, const double* gates,
                                                const double* h_prev, const double* g, double* d, double* dz,
                                                double m) {
  gru_backward_out_row_impl(spec, h, gates, h_prev, g, d, dz, m);
}

// Second half: drh (h) = dz_c RW_c^T, the gradient reaching r h_{t-1}. Writes dz_r and adds drh r to
// carry (d of the first half).
template <typename T>
SPARKGRAD_FORCE_INLINE void gru_backward_reset_row_impl(const LstmSpec& spec, std::int64_t h, const T* r,
                                                        const T* h_prev, const T* drh, T* dzr, T* carry) {
#pragma omp simd
  for (std::int64_t j = 0; j < h; ++j) {
    dzr[j] = drh[j] * h_prev[j];
    carry[j] += drh[j] * r[j];
  }
  act_grad_mul(spec.gate, static_cast<T>(spec.gate_alpha), r, dzr, h);
}
SPARKGRAD_SIMD_CLONES void gru_backward_reset_row(const LstmSpec& spec, std::int64_t h, const float* r,
                                                  const float* h_prev, const float* drh, float* dzr,
                                                  float* carry) {
  gru_backward_reset_row_impl(spec, h, r, h_prev, drh, dzr, carry);
}
SPARKGRAD_SIMD_CLONES void gru_backward_reset_row(const LstmSpec& spec, std::int64_t h, const double* r,
                                                  const double* h_prev, const double* drh, double* dzr,
                                                  double* carry) {
  gru_backward_reset_row_impl(spec, h, r, h_prev, drh, dzr, carry);
}

}  // namespace

template <typename T>
void gru_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                 const T* mask, const T* h0, T* hs, T* gates) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, g3 = 3 * s.h;
  // Every row starts as the bias, then one GEMM adds the input projection of every time step.
  for (std::int64_t row = 0; row < n * t_len; ++row) std::copy(b, b + g3, gates + row * g3);
  gemm<T>(Transpose::No, Transpose::No, n * t_len, g3, s.c, T(1), x, s.c, w, g3, T(1), gates, g3);
  const FixedOperandGemm<T> recurrent_ru(Transpose::No, n, h, 2 * h, rw, g3);
  const FixedOperandGemm<T> recurrent_c(Transpose::No, n, h, h, rw + 2 * h, g3);
  std::unique_ptr<T[]> rh(new T[static_cast<std::size_t>(n * h)]);  // r h_{t-1} of the current step
  for (std::int64_t t = 0; t < t_len; ++t) {
    // rows of step t are strided by t_len in the (n, t, .) layout
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    const std::int64_t ld_prev = t > 0 ? t_len * h : h;
    T* z = gates + t * g3;
    if (h_prev != nullptr) recurrent_ru.multiply(h_prev, ld_prev, T(1), z, t_len * g3);
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      gru_gates_row(spec, h, z + i * t_len * g3, h_prev != nullptr ? h_prev + i * ld_prev : nullptr,
                    rh.get() + i * h);
    }
    if (h_prev != nullptr) recurrent_c.multiply(rh.get(), h, T(1), z + 2 * h, t_len * g3);
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;
      T* zi = z + i * t_len * g3;
      gru_output_row(spec, h, zi + h, zi + 2 * h, h_prev != nullptr ? h_prev + i * ld_prev : nullptr,
                     hs + row * h, mask != nullptr ? mask[row] : T(1));
    }
  }
}

template <typename T>
void gru_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                  const T* h0, const T* hs, const T* gates, const T* dh, T* dgates, T* dx, T* dw, T* drw, T* db,
                  std::int64_t first_step) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, g3 = 3 * s.h, ld = s.t * s.h;
  for (std::int64_t i = 0; i < n; ++i) {  // truncated steps get no gradient
    std::fill(dgates + i * t_len * g3, dgates + (i * t_len + first_step) * g3, T(0));
  }
  // h_prev (n, t, h): the state each step started from; uninitialized storage, every value is written.
  std::unique_ptr<T[]> h_prev(new T[static_cast<std::size_t>(n * ld)]);
  previous_states(s, hs, h0, h_prev.get());
  const bool zero_start = h0 == nullptr;  // step 0 started from a zero state: no gradient through r there
  std::vector<T> d(static_cast<std::size_t>(n * h), T(0));  // dL/dh_t through step t+1
  std::unique_ptr<T[]> drh(new T[static_cast<std::size_t>(n * h)]);
  const FixedOperandGemm<T> recurrent_c_t(Transpose::Yes, n, h, h, rw + 2 * h, g3);
  const FixedOperandGemm<T> recurrent_ru_t(Transpose::Yes, n, 2 * h, h, rw, g3);
  T* d_p = d.data();
  for (std::int64_t t = t_len - 1; t >= first_step; --t) {
    const bool has_prev = t > 0 || !zero_start;
    const T* hp = h_prev.get() + t * h;  // rows strided by ld
    T* dz = dgates + t * g3;  // rows strided by t_len * g3
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;
      gru_backward_out_row(spec, h, gates + row * g3, has_prev ? hp + i * ld : nullptr, dh + row * h,
                           d_p + i * h, dz + i * t_len * g3, mask != nullptr ? mask[row] : T(1));
    }
    if (!has_prev) {  // zero state: r and the recurrent products did nothing
      for (std::int64_t i = 0; i < n; ++i) std::fill(dz + i * t_len * g3, dz + i * t_len * g3 + h, T(0));
      continue;
    }
    recurrent_c_t.multiply(dz + 2 * h, t_len * g3, T(0), drh.get(), h);  // dz_c RW_c^T
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;
      gru_backward_reset_row(spec, h, gates + row * g3, hp + i * ld, drh.get() + i * h, dz + i * t_len * g3,
                             d_p + i * h);
    }
    recurrent_ru_t.multiply(dz, t_len * g3, T(1), d_p, h);  // + dz_ru RW_ru^T
  }
  // Weight gradients with one GEMM each over all steps: dW = x^T dZ, dRW_ru = h_prev^T dZ_ru,
  // dRW_c = (r h_prev)^T dZ_c (r h_prev overwrites h_prev, which is not needed after dRW_ru).
  gemm<T>(Transpose::Yes, Transpose::No, s.c, g3, n * t_len, T(1), x, s.c, dgates, g3, T(0), dw, g3);
  gemm<T>(Transpose::Yes, Transpose::No, h, 2 * h, n * t_len, T(1), h_prev.get(), h, dgates, g3, T(0), drw, g3);
  T* rh = h_prev.get();
  for (std::int64_t row = 0; row < n * t_len; ++row) {
    const T* r = gates + row * g3;
    T* dst = rh + row * h;
#pragma omp simd
    for (std::int64_t j = 0; j < h; ++j) dst[j] *= r[j];
  }
  gemm<T>(Transpose::Yes, Transpose::No, h, h, n * t_len, T(1), rh, h, dgates + 2 * h, g3, T(0), drw + 2 * h, g3);
  column_sums(dgates, n * t_len, g3, db);
  if (dx != nullptr) {
    gemm<T>(Transpose::No, Transpose::Yes, n * t_len, s.c, g3, T(1), dgates, g3, w, g3, T(0), dx, s.c);
  }
}

#define SPARKGRAD_GRU(T)                                                                                        \
  template void gru_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,      \
                               const T*, const T*, T*, T*);                                                     \
  template void gru_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,     \
                                const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*, std::int64_t);
SPARKGRAD_GRU(float)
SPARKGRAD_GRU(double)

}  // namespace sparkgrad::nn
