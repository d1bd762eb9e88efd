// LSTM (DL4J's LSTM layer, no peepholes) forward and backward over a whole sequence.
// Per step: z = x_t W + h_{t-1} RW + b; gate blocks of z in DL4J order [block input a, forget f,
// output o, input gate i]; a = act(z_a), f/o/i = gate(z_.); c = f c_{t-1} + i a; h = o act(c).
// A time step with mask m multiplies h and c by m (DL4J: masked steps output zero and restart the
// state from zero).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// Gate arithmetic is ~10 transcendental calls per hidden unit: worth forking well below kParallelMin.
constexpr std::int64_t kGateParallelMin = 1 << 12;

// f(z) for the elementwise kinds (softmax is rejected by the binding).
template <typename T>
inline T act(Activation kind, T alpha, T z) {
  switch (kind) {
    case Activation::Relu:
      return z > T(0) ? z : T(0);
    case Activation::LeakyRelu:
      return z > T(0) ? z : alpha * z;
    case Activation::Elu:
      return z > T(0) ? z : alpha * std::expm1(z);
    case Activation::Tanh:
      return std::tanh(z);
    case Activation::Sigmoid: {
      if (z >= T(0)) return T(1) / (T(1) + std::exp(-z));
      const T e = std::exp(z);
      return e / (T(1) + e);
    }
    case Activation::Softplus:
      return z > T(0) ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
    case Activation::HardTanh:
      return std::min(T(1), std::max(T(-1), z));
    default:
      return z;  // identity
  }
}

// f'(z) written in terms of y = f(z): every elementwise kind allows it, so only outputs are stored.
template <typename T>
inline T act_grad(Activation kind, T alpha, T y) {
  switch (kind) {
    case Activation::Relu:
      return y > T(0) ? T(1) : T(0);
    case Activation::LeakyRelu:
      return y > T(0) ? T(1) : alpha;
    case Activation::Elu:
      return y > T(0) ? T(1) : y + alpha;
    case Activation::Tanh:
      return T(1) - y * y;
    case Activation::Sigmoid:
      return y * (T(1) - y);
    case Activation::Softplus:
      return -std::expm1(-y);
    case Activation::HardTanh:
      return (y > T(-1) && y < T(1)) ? T(1) : T(0);
    default:
      return T(1);
  }
}

}  // namespace

template <typename T>
void lstm_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                  const T* mask, const T* h0, const T* c0, T* hs, T* cs, T* gates, T* act_c) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, g4 = 4 * s.h;
  const T alpha = static_cast<T>(spec.alpha), gate_alpha = static_cast<T>(spec.gate_alpha);
  // One GEMM for the input projection of every time step: (n*t, c) @ (c, 4h), then the bias.
  gemm<T>(Transpose::No, Transpose::No, n * t_len, g4, s.c, T(1), x, s.c, w, g4, T(0), gates, g4);
  bias_add<T>(gates, b, n * t_len, g4, 1);
  for (std::int64_t t = 0; t < t_len; ++t) {
    // z[:, t] += h_{t-1} RW; rows of step t are strided by t_len in the (n, t, .) layout.
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    const std::int64_t ld_prev = t > 0 ? t_len * h : h;
    if (h_prev != nullptr) {
      gemm<T>(Transpose::No, Transpose::No, n, g4, h, T(1), h_prev, ld_prev, rw, g4, T(1), gates + t * g4,
              t_len * g4);
    }
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;
      T* z = gates + row * g4;
      const T* c_prev = t > 0 ? cs + (row - 1) * h : (c0 != nullptr ? c0 + i * h : nullptr);
      T* c_out = cs + row * h;
      T* h_out = hs + row * h;
      T* ac = act_c + row * h;
      const T m = mask != nullptr ? mask[row] : T(1);
      for (std::int64_t j = 0; j < h; ++j) {
        const T a = act(spec.activation, alpha, z[j]);
        const T f = act(spec.gate, gate_alpha, z[h + j]);
        const T o = act(spec.gate, gate_alpha, z[2 * h + j]);
        const T ig = act(spec.gate, gate_alpha, z[3 * h + j]);
        z[j] = a;
        z[h + j] = f;
        z[2 * h + j] = o;
        z[3 * h + j] = ig;
        const T c = (c_prev != nullptr ? f * c_prev[j] : T(0)) + ig * a;
        const T y = act(spec.activation, alpha, c);
        ac[j] = y;
        c_out[j] = m * c;
        h_out[j] = m * o * y;
      }
    }
  }
}

template <typename T>
void lstm_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                   const T* h0, const T* c0, const T* hs, const T* cs, const T* gates, const T* act_c, const T* dh,
                   T* dgates, T* dx, T* dw, T* drw, T* db) {
  const std::int64_t n = s.n, t_len = s.t, h = s.h, g4 = 4 * s.h;
  const T alpha = static_cast<T>(spec.alpha), gate_alpha = static_cast<T>(spec.gate_alpha);
  std::vector<T> dh_rec(static_cast<std::size_t>(n * h), T(0));  // dL/dh_t through step t+1
  std::vector<T> dc_next(static_cast<std::size_t>(n * h), T(0));  // dL/dc_t through step t+1
  for (std::int64_t t = t_len - 1; t >= 0; --t) {
    if (t < t_len - 1) {
      // dh_rec = dz_{t+1} RW^T
      gemm<T>(Transpose::No, Transpose::Yes, n, h, g4, T(1), dgates + (t + 1) * g4, t_len * g4, rw, g4, T(0),
              dh_rec.data(), h);
    }
    T* dh_rec_p = dh_rec.data();
    T* dc_p = dc_next.data();
#pragma omp parallel for schedule(static) if (n * h >= kGateParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = i * t_len + t;
      const T* g = gates + row * g4;
      const T* ac = act_c + row * h;
      const T* c_prev = t > 0 ? cs + (row - 1) * h : (c0 != nullptr ? c0 + i * h : nullptr);
      const T* dh_out = dh + row * h;
      T* dz = dgates + row * g4;
      T* dh_r = dh_rec_p + i * h;
      T* dc = dc_p + i * h;
      const T m = mask != nullptr ? mask[row] : T(1);
      for (std::int64_t j = 0; j < h; ++j) {
        const T a = g[j], f = g[h + j], o = g[2 * h + j], ig = g[3 * h + j];
        const T dh_t = m * (dh_out[j] + dh_r[j]);
        const T dc_t = m * dc[j] + dh_t * o * act_grad(spec.activation, alpha, ac[j]);
        dz[j] = dc_t * ig * act_grad(spec.activation, alpha, a);
        dz[h + j] = c_prev != nullptr ? dc_t * c_prev[j] * act_grad(spec.gate, gate_alpha, f) : T(0);
        dz[2 * h + j] = dh_t * ac[j] * act_grad(spec.gate, gate_alpha, o);
        dz[3 * h + j] = dc_t * a * act_grad(spec.gate, gate_alpha, ig);
        dc[j] = dc_t * f;
      }
    }
  }
  // Weight gradients with one GEMM each over all time steps: dW = x^T dZ, dRW = h_prev^T dZ.
  gemm<T>(Transpose::Yes, Transpose::No, s.c, g4, n * t_len, T(1), x, s.c, dgates, g4, T(0), dw, g4);
  std::vector<T> h_prev(static_cast<std::size_t>(n * t_len * h));
  for (std::int64_t i = 0; i < n; ++i) {
    T* dst = h_prev.data() + i * t_len * h;
    if (h0 != nullptr) {
      std::copy(h0 + i * h, h0 + (i + 1) * h, dst);
    } else {
      std::fill(dst, dst + h, T(0));
    }
    std::copy(hs + i * t_len * h, hs + ((i + 1) * t_len - 1) * h, dst + h);
  }
  gemm<T>(Transpose::Yes, Transpose::No, h, g4, n * t_len, T(1), h_prev.data(), h, dgates, g4, T(0), drw, g4);
  bias_grad<T>(dgates, db, n * t_len, g4, 1);
  if (dx != nullptr) {
    gemm<T>(Transpose::No, Transpose::Yes, n * t_len, s.c, g4, T(1), dgates, g4, w, g4, T(0), dx, s.c);
  }
}

#define SPARKGRAD_LSTM(T)                                                                                          \
  template void lstm_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,        \
                                const T*, const T*, const T*, T*, T*, T*, T*);                                    \
  template void lstm_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,       \
                                 const T*, const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                                 T*, T*);
SPARKGRAD_LSTM(float)
SPARKGRAD_LSTM(double)

}  // namespace sparkgrad::nn
