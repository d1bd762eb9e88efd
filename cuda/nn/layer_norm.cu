// CUDA twin of cpp/src/nn/layer_norm.cpp: one block per row for the statistics and dx (block sums in
// double, two passes for the variance); the column sums dgain / dbias one thread per column, adding the
// rows in the CPU's blocks of kRowBlock, in order.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

constexpr std::int64_t kRowBlock = 64;  // as cpp/src/nn/layer_norm.cpp

template <typename T>
__global__ void forward_kernel(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t c,
                               double eps) {
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * c;
  __shared__ double m, inv;
  double sum = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += xr[j];
  sum = block_sum(sum);
  if (threadIdx.x == 0) m = sum / static_cast<double>(c);
  __syncthreads();
  double squares = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) squares += (xr[j] - m) * (xr[j] - m);
  squares = block_sum(squares);
  if (threadIdx.x == 0) {
    inv = 1.0 / sqrt(squares / static_cast<double>(c) + eps);
    mean[r] = static_cast<T>(m);
    rstd[r] = static_cast<T>(inv);
  }
  __syncthreads();
  const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const T v = (xr[j] - tm) * ti * gain[j];
    y[r * c + j] = bias != nullptr ? v + bias[j] : v;
  }
}

template <typename T>
__global__ void backward_dx_kernel(const T* x, const T* dy, const T* gain, const T* mean, const T* rstd, T* dx,
                                   std::int64_t c) {
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * c;
  const T* dyr = dy + r * c;
  const T tm = mean[r], ti = rstd[r];
  __shared__ double mean_g, mean_g_xhat;
  double sum_g = 0, sum_g_xhat = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const T xhat = (xr[j] - tm) * ti;
    const double g = static_cast<double>(dyr[j]) * gain[j];
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  sum_g = block_sum(sum_g);
  if (threadIdx.x == 0) mean_g = sum_g / static_cast<double>(c);
  __syncthreads();  // block_sum reuses its shared buffer
  sum_g_xhat = block_sum(sum_g_xhat);
  if (threadIdx.x == 0) mean_g_xhat = sum_g_xhat / static_cast<double>(c);
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const double xhat = (xr[j] - tm) * ti;
    const double g = static_cast<double>(dyr[j]) * gain[j];
    dx[r * c + j] = static_cast<T>(static_cast<double>(ti) * (g - mean_g - xhat * mean_g_xhat));
  }
}

// dgain[j] = sum of dy xhat, dbias[j] = sum of dy over the rows, in blocks of kRowBlock rows.
template <typename T>
__global__ void column_sums_kernel(const T* x, const T* dy, const T* mean, const T* rstd, T* dgain, T* dbias,
                                   std::int64_t rows, std::int64_t c) {
  for (std::int64_t j = first_index(); j < c; j += grid_stride()) {
    double g = 0, b = 0;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      double pg = 0, pb = 0;
      const std::int64_t end = r0 + kRowBlock < rows ? r0 + kRowBlock : rows;
      for (std::int64_t r = r0; r < end; ++r) {
        const T xhat = (x[r * c + j] - mean[r]) * rstd[r];
        pg += static_cast<double>(dy[r * c + j]) * xhat;
        pb += dy[r * c + j];
      }
      g += pg;
      b += pb;
    }
    dgain[j] = static_cast<T>(g);
    if (dbias != nullptr) dbias[j] = static_cast<T>(b);
  }
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t c, double eps) {
  if (rows == 0) return;
  forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, gpu::current_stream()>>>(x, gain, bias, y, mean, rstd,
                                                                                       c, eps);
  check_kernels("layer_norm_forward");
}

template <typename T>
void layer_norm_backward(const T* x, const T* dy, const T* gain, const T* mean, const T* rstd, T* dx, T* dgain,
                         T* dbias, std::int64_t rows, std::int64_t c) {
  // the column sums read dy before dx (which may alias it) is written
  column_sums_kernel<<<blocks_for(c), kThreads, 0, gpu::current_stream()>>>(x, dy, mean, rstd, dgain, dbias, rows,
                                                                            c);
  if (rows > 0) {
    backward_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, gpu::current_stream()>>>(x, dy, gain, mean, rstd,
                                                                                            dx, c);
  }
  check_kernels("layer_norm_backward");
}

#define SPARKGRAD_LAYER_NORM(T)                                                                                \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, T*, T*, std::int64_t, std::int64_t,   \
                                      double);                                                               \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*,           \
                                       std::int64_t, std::int64_t);
SPARKGRAD_LAYER_NORM(float)
SPARKGRAD_LAYER_NORM(double)

}  // namespace sparkgrad::nn::cuda
