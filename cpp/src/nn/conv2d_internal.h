// Private pieces shared by the two convolution algorithms: im2col + GEMM (conv2d.cpp, which also picks
// the algorithm per shape) and Winograd F(2x2, 3x3) (conv2d_winograd.cpp).
#pragma once

#include <cstdint>
#include <mutex>

#include "cblas.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::detail {

// OpenBLAS has one process-wide thread count. While a conv2d call runs its own OpenMP team, BLAS is held
// at one thread so that each member's GEMM runs inline in that member, instead of asking for a nested
// team of workers (see common/blas.cpp) on cores that are already busy. Concurrent calls share the
// hold; the last one out restores the count.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holders_++ == 0) {
      saved_ = scipy_openblas_get_num_threads();
      if (saved_ != 1) scipy_openblas_set_num_threads(1);
    }
  }
  ~SingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--holders_ == 0 && saved_ != 1) scipy_openblas_set_num_threads(saved_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  static inline std::mutex mutex_;
  static inline int holders_ = 0;
  static inline int saved_ = 1;
};

// Winograd F(2x2, 3x3) for 3x3 stride-1 shapes (any padding; conv2d_winograd_applies). Same contracts as
// conv2d_forward / conv2d_backward_weight; relu: the forward's epilogue clamps at zero after the bias.
template <typename T>
void winograd_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, bool relu, T* y);
template <typename T>
void winograd_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw);

}  // namespace sparkgrad::nn::detail
