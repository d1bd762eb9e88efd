// CUDA twin of cpp/src/nn/gru.cpp (libnd4j's GRU cell, gate blocks [r, u, c], the reset gate before the
// candidate's recurrent product). Forward: the bias broadcast into every row, the input projection of all
// steps in one cuBLAS GEMM, then per step the [r | u] recurrent GEMM, one kernel for the gates and r h_{t-1},
// the candidate's recurrent GEMM and one kernel for c, h and the mask. Backward: per step one kernel (dz_u,
// dz_c), the GEMM dz_c RW_c^T, one kernel (dz_r) and the GEMM dz_ru RW_ru^T, then one GEMM per weight
// gradient over all steps; db sums the rows in double (channel_sums). The kernels and GEMMs of one call queue
// on the calling thread's stream (gpu::set_stream); launches are checked as they go.
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

// Step t, one thread per (example i, unit j): r and u of gates[i, t] (n, t, 3h) activated in place;
// rh: (n, h) = r h_prev, with h_prev the state the step starts from (hs of step t-1 or h0: (n, h); null: zero).
template <typename T>
__global__ void gates_step_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, const T* h0, const T* hs, T* gates,
                                  T* rh) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    T* z = gates + row * 3 * h;
    const T r = forward_value(sp.gate, sp.gate_alpha, z[j]);
    z[j] = r;
    z[h + j] = forward_value(sp.gate, sp.gate_alpha, z[h + j]);
    if (t > 0) {
      rh[e] = r * hs[(row - 1) * h + j];
    } else if (h0 != nullptr) {
      rh[e] = r * h0[e];
    }
  }
}

// Step t, one thread per (i, j): the candidate activated in place, then hs[i, t] = m (u h_prev + (1 - u) c).
template <typename T>
__global__ void output_step_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, const T* mask, const T* h0, T* hs,
                                   T* gates) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    T* z = gates + row * 3 * h;
    const T u = z[h + j];
    const T c = forward_value(sp.act, sp.alpha, z[2 * h + j]);
    z[2 * h + j] = c;
    T out;
    if (t > 0) {
      out = u * hs[(row - 1) * h + j] + (T(1) - u) * c;
    } else if (h0 != nullptr) {
      out = u * h0[e] + (T(1) - u) * c;
    } else {
      out = (T(1) - u) * c;
    }
    hs[row * h + j] = (mask != nullptr ? mask[row] : T(1)) * out;
  }
}

// Backward of step t, first half, one thread per (i, j): d (n, h) holds dL/dh_t through step t+1; with
// dh (n, t, h), dh_t = m (d + dh) gives dz_u and dz_c of dgates[i, t], and d becomes dh_t u. h_prev: (n, t, h)
// the state every step started from. Without a previous state (has_prev false) dz_r is zero.
template <typename T>
__global__ void backward_out_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, bool has_prev, const T* mask,
                                    const T* h_prev, const T* gates, const T* dh, T* d, T* dgates) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    const T* g = gates + row * 3 * h;
    const T u = g[h + j], c = g[2 * h + j];
    const T m = mask != nullptr ? mask[row] : T(1);
    const T dj = m * (d[e] + dh[row * h + j]);
    const T hp = has_prev ? h_prev[row * h + j] : T(0);
    T* dz = dgates + row * 3 * h;
    if (!has_prev) dz[j] = T(0);
    dz[h + j] = (has_prev ? dj * (hp - c) : -dj * c) * grad_from_output(sp.gate, sp.gate_alpha, u);
    dz[2 * h + j] = dj * (T(1) - u) * grad_from_output(sp.act, sp.alpha, c);
    d[e] = dj * u;
  }
}

// Second half, one thread per (i, j): drh (n, h) = dz_c RW_c^T gives dz_r, and d += drh r.
template <typename T>
__global__ void backward_reset_kernel(StepSpec<T> sp, LstmShape s, std::int64_t t, const T* h_prev, const T* gates,
                                      const T* drh, T* d, T* dgates) {
  const std::int64_t h = s.h;
  for (std::int64_t e = first_index(); e < s.n * h; e += grid_stride()) {
    const std::int64_t i = e / h, j = e % h, row = i * s.t + t;
    const T r = gates[row * 3 * h + j];
    dgates[row * 3 * h + j] = drh[e] * h_prev[row * h + j] * grad_from_output(sp.gate, sp.gate_alpha, r);
    d[e] += drh[e] * r;
  }
}

// rh (rows, h) *= r of gates (rows, 3h): h_prev becomes r h_prev for the candidate's weight gradient.
template <typename T>
__global__ void times_reset_kernel(std::int64_t rows, std::int64_t h, const T* gates, T* rh) {
  for (std::int64_t e = first_index(); e < rows * h; e += grid_stride()) rh[e] *= gates[(e / h) * 3 * h + e % h];
}

}  // namespace

// x: (n, t, c); w: (c, 3h); rw: (h, 3h); b: (3h); mask: (n, t) or null; h0: (n, h) or null;
// hs: (n, t, h); gates: (n, t, 3h).
template <typename T>
void gru_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                 const T* mask, const T* h0, T* hs, T* gates) {
  const char* op = "gru_forward";
  const std::int64_t rows = s.n * s.t, h = s.h, g3 = 3 * s.h;
  if (rows == 0 || h == 0) return;
  const StepSpec<T> sp = step_spec<T>(spec);
  cudaStream_t stream = gpu::current_stream();
  broadcast_bias_kernel<<<blocks_for(rows * g3), kThreads, 0, stream>>>(b, gates, rows, g3);
  check_cuda(op, cudaGetLastError());
  if (s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, rows, g3, s.c, T(1), x, s.c, w, g3, T(1), gates, g3);
  }
  DeviceBuffer<T> rh(op, s.n * h);
  for (std::int64_t t = 0; t < s.t; ++t) {
    // rows of step t are strided by t * (row length) in the (n, t, .) layout
    const T* h_prev = t > 0 ? hs + (t - 1) * h : h0;
    T* z = gates + t * g3;
    if (h_prev != nullptr) {  // z_ru += h_{t-1} RW_ru
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, s.n, 2 * h, h, T(1), h_prev, t > 0 ? s.t * h : h, rw, g3,
                              T(1), z, s.t * g3);
    }
    gates_step_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(sp, s, t, h0, hs, gates, rh.get());
    check_cuda(op, cudaGetLastError());
    if (h_prev != nullptr) {  // z_c += (r h_{t-1}) RW_c
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, s.n, h, h, T(1), rh.get(), h, rw + 2 * h, g3, T(1),
                              z + 2 * h, s.t * g3);
    }
    output_step_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(sp, s, t, mask, h0, hs, gates);
    check_cuda(op, cudaGetLastError());
  }
  check_kernels(op);
}

// Outputs of gru_forward plus dh: (n, t, h) -> dgates: (n, t, 3h), dx: (n, t, c) or null, dw: (c, 3h),
// drw: (h, 3h), db: (3h); steps before first_step get no gradient.
template <typename T>
void gru_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                  const T* h0, const T* hs, const T* gates, const T* dh, T* dgates, T* dx, T* dw, T* drw, T* db,
                  std::int64_t first_step) {
  const char* op = "gru_backward";
  const std::int64_t rows = s.n * s.t, h = s.h, g3 = 3 * s.h;
  if (rows == 0 || h == 0) return;
  const StepSpec<T> sp = step_spec<T>(spec);
  cudaStream_t stream = gpu::current_stream();
  if (first_step > 0) {  // truncated steps: the first first_step rows of every example
    const std::size_t row_bytes = sizeof(T) * static_cast<std::size_t>(g3);
    check_cuda(op, cudaMemset2DAsync(dgates, row_bytes * static_cast<std::size_t>(s.t), 0,
                                     row_bytes * static_cast<std::size_t>(first_step), static_cast<std::size_t>(s.n),
                                     stream));
  }
  DeviceBuffer<T> h_prev(op, rows * h), d(op, s.n * h), drh(op, s.n * h);
  previous_h_kernel<<<blocks_for(rows * h), kThreads, 0, stream>>>(s, hs, h0, h_prev.get());
  check_cuda(op, cudaGetLastError());
  fill_zero(op, d.get(), sizeof(T) * static_cast<std::size_t>(s.n * h));
  for (std::int64_t t = s.t - 1; t >= first_step; --t) {
    const bool has_prev = t > 0 || h0 != nullptr;
    T* dz = dgates + t * g3;
    backward_out_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(sp, s, t, has_prev, mask, h_prev.get(), gates,
                                                                      dh, d.get(), dgates);
    check_cuda(op, cudaGetLastError());
    if (!has_prev) continue;  // a zero state: r and the recurrent products did nothing
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, s.n, h, h, T(1), dz + 2 * h, s.t * g3, rw + 2 * h, g3, T(0),
                            drh.get(), h);
    backward_reset_kernel<<<blocks_for(s.n * h), kThreads, 0, stream>>>(sp, s, t, h_prev.get(), gates, drh.get(),
                                                                        d.get(), dgates);
    check_cuda(op, cudaGetLastError());
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, s.n, h, 2 * h, T(1), dz, s.t * g3, rw, g3, T(1), d.get(),
                            h);
  }
  // Weight gradients with one GEMM each over all steps: dW = x^T dZ, dRW_ru = h_prev^T dZ_ru,
  // dRW_c = (r h_prev)^T dZ_c.
  if (s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, s.c, g3, rows, T(1), x, s.c, dgates, g3, T(0), dw, g3);
  }
  sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, h, 2 * h, rows, T(1), h_prev.get(), h, dgates, g3, T(0), drw,
                          g3);
  times_reset_kernel<<<blocks_for(rows * h), kThreads, 0, stream>>>(rows, h, gates, h_prev.get());
  check_cuda(op, cudaGetLastError());
  sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, h, h, rows, T(1), h_prev.get(), h, dgates + 2 * h, g3, T(0),
                          drw + 2 * h, g3);
  channel_sums(op, dgates, db, rows, g3, std::int64_t{1});  // column sums of dgates: (rows, 3h)
  if (dx != nullptr && s.c > 0) {
    sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, rows, s.c, g3, T(1), dgates, g3, w, g3, T(0), dx, s.c);
  }
  check_kernels(op);
}

#define SPARKGRAD_GRU(T)                                                                                        \
  template void gru_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,      \
                               const T*, const T*, T*, T*);                                                     \
  template void gru_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,     \
                                const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*, std::int64_t);
SPARKGRAD_GRU(float)
SPARKGRAD_GRU(double)

}  // namespace sparkgrad::nn::cuda
