// Private kernels shared by the recurrent CUDA twins (lstm.cu, gru.cu, simple_rnn.cu), as
// cpp/src/nn/recurrent_util.h is for the CPU ones. Internal linkage: every including file gets its own copy.
#pragma once

#include <cstdint>

#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {
namespace {

// The activation kinds of a gated cell (LSTM, GRU) and their alphas in T, passed by value to the step
// kernels.
template <typename T>
struct StepSpec {
  Activation act, gate;
  T alpha, gate_alpha;
};

template <typename T>
StepSpec<T> step_spec(const LstmSpec& spec) {
  return {spec.activation, spec.gate, static_cast<T>(spec.alpha), static_cast<T>(spec.gate_alpha)};
}

// out: (rows, width), every row set to b: (width); the start of the input projection of every step.
template <typename T>
__global__ void broadcast_bias_kernel(const T* b, T* out, std::int64_t rows, std::int64_t width) {
  using namespace sparkgrad::detail::cuda;
  for (std::int64_t e = first_index(); e < rows * width; e += grid_stride()) out[e] = b[e % width];
}

// h_prev: (n, t, h), row (i, t) = h_{t-1} of example i (h0 or zero at t = 0): the state each step started
// from, for the recurrent weights' gradient.
template <typename T>
__global__ void previous_h_kernel(LstmShape s, const T* hs, const T* h0, T* h_prev) {
  using namespace sparkgrad::detail::cuda;
  const std::int64_t h = s.h, total = s.n * s.t * h;
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) {
    const std::int64_t row = e / h, t = row % s.t;
    if (t > 0) {
      h_prev[e] = hs[e - h];
    } else {
      h_prev[e] = h0 != nullptr ? h0[(row / s.t) * h + e % h] : T(0);
    }
  }
}

}  // namespace
}  // namespace sparkgrad::nn::cuda
