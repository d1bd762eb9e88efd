// The Winograd F(2x2, 3x3) kernels (conv2d_winograd.cpp), called by conv2d.cpp where its per-shape rule
// picks them.
#pragma once

#include <cstdint>

#include "sparkgrad/nn.h"

namespace sparkgrad::nn::detail {

// Winograd F(2x2, 3x3) for the shapes conv2d_winograd_applies accepts. Same contracts as
// conv2d_forward / conv2d_backward_weight; relu: the forward's epilogue clamps at zero after the bias.
template <typename T>
void winograd_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, bool relu, T* y);
template <typename T>
void winograd_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw);

}  // namespace sparkgrad::nn::detail
