// Private kernels shared by the recurrent CUDA twins (lstm.cu, simple_rnn.cu), as cpp/src/nn/recurrent_util.h
// is for the CPU ones. Internal linkage: every including file gets its own copy.
#pragma once

#include <cstdint>

#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {
namespace {

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
