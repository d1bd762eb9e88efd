// The cuDNN path of the CUDA convolutions (conv2d_cudnn.cu, compiled when CMake found cuDNN; the build then
// defines SPARKGRAD_HAS_CUDNN for the CUDA sources). Same shapes and semantics as the declarations in
// sparkgrad/nn.h, without bias and activation: conv2d.cu adds those in one pass over y.
#pragma once

#include <string>

#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda::cudnn {

// Why cuDNN cannot compute g exactly, or "" when it can: cuDNN pads both sides of each axis by the same
// amount, so the output size must be what pad_top/pad_left on both sides give (a "same" convolution
// whose padding is uneven is not), and every tensor must be non-empty with 32-bit dimensions.
std::string unsupported(const Conv2dShape& g);

// Each pass returns false, having run nothing, when cuDNN has no algorithm for g in the calling thread's
// precision that is deterministic and (in float32) as exact as a sum of products (gpu::current_precision).
// x: (n, c, h, w), weights: (k, c, r, s) -> y: (n, k, p, q) (overwritten).
template <typename T>
bool forward(const Conv2dShape& g, const T* x, const T* weights, T* y);
// dy: (n, k, p, q), weights: (k, c, r, s) -> dx: (n, c, h, w) (overwritten).
template <typename T>
bool backward_input(const Conv2dShape& g, const T* dy, const T* weights, T* dx);
// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c, r, s) summed over the batch (overwritten).
template <typename T>
bool backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw);

}  // namespace sparkgrad::nn::cuda::cudnn
