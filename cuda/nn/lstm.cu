// CUDA twin of cpp/src/nn/lstm.cpp (DL4J's LSTM without peepholes, gate blocks [a, f, o, i]). Forward:
// the bias broadcast into every row, the input projection of all steps in one cuBLAS GEMM, then per step
// one recurrent GEMM and one fused kernel for the gate nonlinearities, cell, output and mask. Backward: per
// step one GEMM (dz_{t+1} RW^T) and one fused kernel, then one GEMM per weight gradient over all steps; db
// sums the rows in double (channel_sums). The kernels and GEMMs of one call queue on the calling thread's
// stream (gpu::set_stream); launches are checked as they go.
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

// Step t, one thread per (example i, unit j): activates z = gates[i, t] in place, then c, act(c), h.
// hs, cs, act_c: (n, t, h); gates: (n, t, 4h); mask: (n, t) or null; c0: (n, h) or null.
template <typename T>
__global__ void forward_step_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, const T* mask, const T* c0,
                                    T* hs, T* cs, T* gates, T* act_c) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    T* z = gates + row * 4 * h;
    const T a = forward_value(sp.act, sp.alpha, z[j]);
    const T f = forward_value(sp.gate, sp.gate_alpha, z[h + j]);
    const T o = forward_value(sp.gate, sp.gate_alpha, z[2 * h + j]);
    const T ig = forward_value(sp.gate, sp.gate_alpha, z[3 * h + j]);
    z[j] = a;
    z[h + j] = f;
    z[2 * h + j] = o;
    z[3 * h + j] = ig;
    T c;
    if (t > 0) {
      c = f * cs[(row - 1) * h + j] + ig * a;
    } else if (c0 != nullptr) {
      c = f * c0[e] + ig * a;
    } else {
      c = ig * a;
    }
    const T ac = forward_value(sp.act, sp.alpha, c);
    const T m = mask != nullptr ? mask[row] : T(1);
    act_c[row * h + j] = ac;
    hs[row * h + j] = m * o * ac;
    cs[row * h + j] = c * m;
  }
}

// Backward of step t, one thread per (i, j): dgates[i, t] from dh (n, t, h) plus dh_rec = dz_{t+1} RW^T
// (n, h), and dc: (n, h) = dL/dc_t through step t+1, replaced by dL/dc_{t-1}.
template <typename T>
__global__ void backward_step_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, const T* mask, const T* c0,
                                     const T* cs, const T* gates, const T* act_c, const T* dh, const T* dh_rec,
                                     T* dc, T* dgates) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    const T* g = gates + row * 4 * h;
    const T a = g[j], f = g[h + j], o = g[2 * h + j], ig = g[3 * h + j];
    const T ac = act_c[row * h + j];
    const T m = mask != nullptr ? mask[row] : T(1);
    const T dh_t = m * (dh[row * h + j] + dh_rec[e]);
    const T dc_t = m * dc[e] + dh_t * o * grad_from_output(sp.act, sp.alpha, ac);
    T* dz = dgates + row * 4 * h;
    dz[j] = dc_t * ig * grad_from_output(sp.act, sp.alpha, a);
    if (t > 0 || c0 != nullptr) {
      const T c_prev = t > 0 ? cs[(row - 1) * h + j] : c0[e];
      dz[h + j] = dc_t * c_prev * grad_from_output(sp.gate, sp.gate_alpha, f);
    } else {
      dz[h + j] = T(0);
    }
    dz[2 * h + j] = dh_t * ac * grad_from_output(sp.gate, sp.gate_alpha, o);
    dz[3 * h + j] = dc_t * a * grad_from_output(sp.gate, sp.gate_alpha, ig);
    dc[e] = dc_t * f;
  }
}

}  // namespace

// x: (n, t, c); w: (c, 4h); rw: (h, 4h); b: (4h); mask: (n, t) or null; h0, c0: (n, h) or null;
// hs, cs, act_c: (n, t, h); gates: (n, t, 4h).
template <typename T>
void lstm_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                  const T* mask, const T* h0, const T* c0, T* hs, T* cs, T* gates, T* act_c) {
  const char* op = "lstm_forward";
  const std::int64_t rows = s.n * s.t, h = s.h, g4 = 4 * s.h;
  if (rows == 0 || h == 0) return;
  const StepSpec<T> sp = step_spec<T>(spec);
  broadcast_bias_kernel<<<blocks_for(rows * g4), kThreads, 0, gpu::current_stream()>>>(b, gates, rows, g4);
  check_cuda(op, cudaGetLastError());
  if (s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, rows, g4, s.c, T(1), x, s.c, w, g4, T(1), gates, g4);
  }
  for (std::int64_t t = 0; t < s.t; ++t) {
    // z[:, t] += h_{t-1} RW; rows of step t are strided by t * (row length) in the (n, t, .) layout.
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    if (h_prev != nullptr) {
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, s.n, g4, h, T(1), h_prev, t > 0 ? s.t * h : h, rw, g4,
                              T(1), gates + t * g4, s.t * g4);
    }
    forward_step_kernel<<<blocks_for(s.n * h), kThreads, 0, gpu::current_stream()>>>(sp, s, t, mask, c0, hs, cs, gates, act_c);
    check_cuda(op, cudaGetLastError());
  }
  check_kernels(op);
}

// Outputs of lstm_forward plus dh: (n, t, h) -> dgates: (n, t, 4h), dx: (n, t, c) or null, dw: (c, 4h),
// drw: (h, 4h), db: (4h); steps before first_step get no gradient.
template <typename T>
void lstm_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                   const T* h0, const T* c0, const T* hs, const T* cs, const T* gates, const T* act_c, const T* dh,
                   T* dgates, T* dx, T* dw, T* drw, T* db, std::int64_t first_step) {
  const char* op = "lstm_backward";
  const std::int64_t rows = s.n * s.t, h = s.h, g4 = 4 * s.h;
  if (rows == 0 || h == 0) return;
  const StepSpec<T> sp = step_spec<T>(spec);
  if (first_step > 0) {  // truncated steps: the first first_step rows of every example
    const std::size_t row_bytes = sizeof(T) * static_cast<std::size_t>(g4);
    check_cuda(op, cudaMemset2DAsync(dgates, row_bytes * static_cast<std::size_t>(s.t), 0,
                                     row_bytes * static_cast<std::size_t>(first_step), static_cast<std::size_t>(s.n),
                                     gpu::current_stream()));
  }
  DeviceBuffer<T> dh_rec(op, s.n * h), dc_next(op, s.n * h);
  fill_zero(op, dh_rec.get(), sizeof(T) * static_cast<std::size_t>(s.n * h));
  fill_zero(op, dc_next.get(), sizeof(T) * static_cast<std::size_t>(s.n * h));
  for (std::int64_t t = s.t - 1; t >= first_step; --t) {
    if (t < s.t - 1) {
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, s.n, h, g4, T(1), dgates + (t + 1) * g4, s.t * g4, rw,
                              g4, T(0), dh_rec.get(), h);
    }
    backward_step_kernel<<<blocks_for(s.n * h), kThreads, 0, gpu::current_stream()>>>(sp, s, t, mask, c0, cs, gates, act_c, dh,
                                                            dh_rec.get(), dc_next.get(), dgates);
    check_cuda(op, cudaGetLastError());
  }
  // Weight gradients with one GEMM each over all steps: dW = x^T dZ, dRW = h_prev^T dZ.
  if (s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, s.c, g4, rows, T(1), x, s.c, dgates, g4, T(0), dw, g4);
  }
  DeviceBuffer<T> h_prev(op, rows * h);
  previous_h_kernel<<<blocks_for(rows * h), kThreads, 0, gpu::current_stream()>>>(s, hs, h0, h_prev.get());
  check_cuda(op, cudaGetLastError());
  sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, h, g4, rows, T(1), h_prev.get(), h, dgates, g4, T(0), drw,
                          g4);
  channel_sums(op, dgates, db, rows, g4, std::int64_t{1});  // column sums of dgates: (rows, 4h)
  if (dx != nullptr && s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, rows, s.c, g4, T(1), dgates, g4, w, g4, T(0), dx, s.c);
  }
  check_kernels(op);
}

#define SPARKGRAD_LSTM(T)                                                                                          \
  template void lstm_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,        \
                                const T*, const T*, const T*, T*, T*, T*, T*);                                    \
  template void lstm_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,       \
                                 const T*, const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                                 T*, T*, std::int64_t);
SPARKGRAD_LSTM(float)
SPARKGRAD_LSTM(double)

}  // namespace sparkgrad::nn::cuda
