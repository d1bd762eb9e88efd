// CUDA twin of cpp/src/nn/batchnorm.cpp: one block per channel; statistics accumulate in double (two
// passes for the variance), as on the CPU.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// Flat offset of the e-th of the n*inner values of channel j.
__device__ std::int64_t channel_offset(const BatchNormShape& g, std::int64_t j, std::int64_t e) {
  return ((e / g.inner) * g.c + j) * g.inner + e % g.inner;
}

// y = gamma * (x - mean) / sqrt(var + eps) + beta over channel j, strided over the block's threads.
template <typename T>
__device__ void normalize_channel(const BatchNormShape& g, std::int64_t j, const T* x, T* y, double mean,
                                  double var, double gamma, double beta, double eps) {
  const T scale = static_cast<T>(gamma / sqrt(var + eps));
  const T shift = static_cast<T>(beta - mean * gamma / sqrt(var + eps));
  for (std::int64_t e = threadIdx.x; e < g.n * g.inner; e += blockDim.x) {
    const std::int64_t o = channel_offset(g, j, e);
    y[o] = scale * x[o] + shift;
  }
}

template <typename T>
__global__ void forward_train_kernel(BatchNormShape g, const T* x, const T* gamma, const T* beta, T* y,
                                     T* batch_mean, T* batch_var, T* running_mean, T* running_var, double decay,
                                     double eps) {
  const std::int64_t j = blockIdx.x;
  const std::int64_t count = g.n * g.inner;
  __shared__ double mean, var;
  double sum = 0;
  for (std::int64_t e = threadIdx.x; e < count; e += blockDim.x) sum += x[channel_offset(g, j, e)];
  sum = block_sum(sum);
  if (threadIdx.x == 0) mean = count > 0 ? sum / static_cast<double>(count) : 0.0;
  __syncthreads();
  double squares = 0;
  for (std::int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const double d = x[channel_offset(g, j, e)] - mean;
    squares += d * d;
  }
  squares = block_sum(squares);
  if (threadIdx.x == 0) {
    var = count > 0 ? squares / static_cast<double>(count) : 0.0;
    batch_mean[j] = static_cast<T>(mean);
    batch_var[j] = static_cast<T>(var);
    running_mean[j] = static_cast<T>(decay * running_mean[j] + (1.0 - decay) * mean);
    running_var[j] = static_cast<T>(decay * running_var[j] + (1.0 - decay) * var);
  }
  __syncthreads();
  normalize_channel(g, j, x, y, mean, var, gamma[j], beta[j], eps);
}

template <typename T>
__global__ void forward_inference_kernel(BatchNormShape g, const T* x, const T* gamma, const T* beta,
                                         const T* running_mean, const T* running_var, T* y, double eps) {
  const std::int64_t j = blockIdx.x;
  normalize_channel(g, j, x, y, running_mean[j], running_var[j], gamma[j], beta[j], eps);
}

// dx = gamma / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)), per channel.
template <typename T>
__global__ void backward_kernel(BatchNormShape g, const T* x, const T* dy, const T* gamma, const T* batch_mean,
                                const T* batch_var, T* dx, T* dgamma, T* dbeta, double eps) {
  const std::int64_t j = blockIdx.x;
  const std::int64_t count = g.n * g.inner;
  const double mean = batch_mean[j];
  const double inv_std = 1.0 / sqrt(static_cast<double>(batch_var[j]) + eps);
  __shared__ double mean_dy, mean_dy_xhat;
  double sum_dy = 0, sum_dy_xhat = 0;
  for (std::int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const std::int64_t o = channel_offset(g, j, e);
    sum_dy += dy[o];
    sum_dy_xhat += dy[o] * (x[o] - mean) * inv_std;
  }
  sum_dy = block_sum(sum_dy);
  if (threadIdx.x == 0) {
    dbeta[j] = static_cast<T>(sum_dy);
    mean_dy = count > 0 ? sum_dy / static_cast<double>(count) : 0.0;
  }
  __syncthreads();  // block_sum reuses its shared buffer
  sum_dy_xhat = block_sum(sum_dy_xhat);
  if (threadIdx.x == 0) {
    dgamma[j] = static_cast<T>(sum_dy_xhat);
    mean_dy_xhat = count > 0 ? sum_dy_xhat / static_cast<double>(count) : 0.0;
  }
  __syncthreads();
  const double scale = gamma[j] * inv_std;
  for (std::int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const std::int64_t o = channel_offset(g, j, e);
    const double xhat = (x[o] - mean) * inv_std;
    dx[o] = static_cast<T>(scale * (dy[o] - mean_dy - xhat * mean_dy_xhat));
  }
}

}  // namespace

template <typename T>
void batchnorm_forward_train(const BatchNormShape& g, const T* x, const T* gamma, const T* beta, T* y,
                             T* batch_mean, T* batch_var, T* running_mean, T* running_var, double decay,
                             double eps) {
  if (g.c == 0) return;
  forward_train_kernel<<<static_cast<unsigned>(g.c), kThreads, 0, gpu::current_stream()>>>(g, x, gamma, beta, y, batch_mean, batch_var,
                                                                 running_mean, running_var, decay, eps);
  check_kernels("batchnorm_forward_train");
}

template <typename T>
void batchnorm_forward_inference(const BatchNormShape& g, const T* x, const T* gamma, const T* beta,
                                 const T* running_mean, const T* running_var, T* y, double eps) {
  if (g.c == 0) return;
  forward_inference_kernel<<<static_cast<unsigned>(g.c), kThreads, 0, gpu::current_stream()>>>(g, x, gamma, beta, running_mean, running_var,
                                                                     y, eps);
  check_kernels("batchnorm_forward_inference");
}

template <typename T>
void batchnorm_backward(const BatchNormShape& g, const T* x, const T* dy, const T* gamma, const T* batch_mean,
                        const T* batch_var, T* dx, T* dgamma, T* dbeta, double eps) {
  if (g.c == 0) return;
  backward_kernel<<<static_cast<unsigned>(g.c), kThreads, 0, gpu::current_stream()>>>(g, x, dy, gamma, batch_mean, batch_var, dx, dgamma,
                                                            dbeta, eps);
  check_kernels("batchnorm_backward");
}

#define SPARKGRAD_BATCHNORM(T)                                                                                 \
  template void batchnorm_forward_train<T>(const BatchNormShape&, const T*, const T*, const T*, T*, T*, T*, T*, \
                                           T*, double, double);                                              \
  template void batchnorm_forward_inference<T>(const BatchNormShape&, const T*, const T*, const T*, const T*,  \
                                               const T*, T*, double);                                          \
  template void batchnorm_backward<T>(const BatchNormShape&, const T*, const T*, const T*, const T*, const T*, \
                                      T*, T*, T*, double);
SPARKGRAD_BATCHNORM(float)
SPARKGRAD_BATCHNORM(double)

}  // namespace sparkgrad::nn::cuda
