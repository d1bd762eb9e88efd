// Batch normalization over (n, c, inner) tensors with per-channel statistics; OpenMP over channels
// (statistics accumulate in double, two passes for the variance).
#include <cmath>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// fn(i, values) for each of the n contiguous inner-length runs of channel j.
template <typename T, typename Fn>
void for_each_run(const BatchNormShape& g, const T* base, std::int64_t j, Fn fn) {
  for (std::int64_t i = 0; i < g.n; ++i) fn(i, base + (i * g.c + j) * g.inner);
}

// y = gamma * (x - mean) / sqrt(var + eps) + beta for channel j.
template <typename T>
void normalize_channel(const BatchNormShape& g, std::int64_t j, const T* x, T* y, double mean, double var,
                       double gamma, double beta, double eps) {
  const T scale = static_cast<T>(gamma / std::sqrt(var + eps));
  const T shift = static_cast<T>(beta - mean * gamma / std::sqrt(var + eps));
  for (std::int64_t i = 0; i < g.n; ++i) {
    const std::int64_t offset = (i * g.c + j) * g.inner;
    for (std::int64_t e = 0; e < g.inner; ++e) y[offset + e] = scale * x[offset + e] + shift;
  }
}

bool parallel_channels(const BatchNormShape& g) { return g.n * g.c * g.inner >= detail::kParallelMin && g.c > 1; }

}  // namespace

template <typename T>
void batchnorm_forward_train(const BatchNormShape& g, const T* x, const T* gamma, const T* beta, T* y,
                             T* batch_mean, T* batch_var, T* running_mean, T* running_var, double decay,
                             double eps) {
  const double count = static_cast<double>(g.n * g.inner);
#pragma omp parallel for schedule(static) if (parallel_channels(g))
  for (std::int64_t j = 0; j < g.c; ++j) {
    double sum = 0;
    for_each_run(g, x, j, [&](std::int64_t, const T* run) {
      for (std::int64_t e = 0; e < g.inner; ++e) sum += run[e];
    });
    const double mean = count > 0 ? sum / count : 0.0;
    double squares = 0;
    for_each_run(g, x, j, [&](std::int64_t, const T* run) {
      for (std::int64_t e = 0; e < g.inner; ++e) squares += (run[e] - mean) * (run[e] - mean);
    });
    const double var = count > 0 ? squares / count : 0.0;
    batch_mean[j] = static_cast<T>(mean);
    batch_var[j] = static_cast<T>(var);
    running_mean[j] = static_cast<T>(decay * running_mean[j] + (1.0 - decay) * mean);
    running_var[j] = static_cast<T>(decay * running_var[j] + (1.0 - decay) * var);
    normalize_channel(g, j, x, y, mean, var, gamma[j], beta[j], eps);
  }
}

template <typename T>
void batchnorm_forward_inference(const BatchNormShape& g, const T* x, const T* gamma, const T* beta,
                                 const T* running_mean, const T* running_var, T* y, double eps) {
#pragma omp parallel for schedule(static) if (parallel_channels(g))
  for (std::int64_t j = 0; j < g.c; ++j) {
    normalize_channel(g, j, x, y, running_mean[j], running_var[j], gamma[j], beta[j], eps);
  }
}

// dx = gamma / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)), per channel.
template <typename T>
void batchnorm_backward(const BatchNormShape& g, const T* x, const T* dy, const T* gamma, const T* batch_mean,
                        const T* batch_var, T* dx, T* dgamma, T* dbeta, double eps) {
  const double count = static_cast<double>(g.n * g.inner);
#pragma omp parallel for schedule(static) if (parallel_channels(g))
  for (std::int64_t j = 0; j < g.c; ++j) {
    const double mean = batch_mean[j];
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(batch_var[j]) + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for_each_run(g, dy, j, [&](std::int64_t i, const T* run) {
      const T* xr = x + (i * g.c + j) * g.inner;
      for (std::int64_t e = 0; e < g.inner; ++e) {
        sum_dy += run[e];
        sum_dy_xhat += run[e] * (xr[e] - mean) * inv_std;
      }
    });
    dbeta[j] = static_cast<T>(sum_dy);
    dgamma[j] = static_cast<T>(sum_dy_xhat);
    if (count == 0) continue;
    const double scale = gamma[j] * inv_std;
    const double mean_dy = sum_dy / count, mean_dy_xhat = sum_dy_xhat / count;
    for (std::int64_t i = 0; i < g.n; ++i) {
      const std::int64_t offset = (i * g.c + j) * g.inner;
      for (std::int64_t e = 0; e < g.inner; ++e) {
        const double xhat = (x[offset + e] - mean) * inv_std;
        dx[offset + e] = static_cast<T>(scale * (dy[offset + e] - mean_dy - xhat * mean_dy_xhat));
      }
    }
  }
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

}  // namespace sparkgrad::nn
