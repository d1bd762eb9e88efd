// Layer normalization over the c values of each row; OpenMP over rows (statistics accumulate in double,
// two passes for the variance). The backward's column sums (dgain, dbias) add blocks of kRowBlock rows
// in order, so they do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

constexpr std::int64_t kRowBlock = 64;

bool parallel_rows(std::int64_t rows, std::int64_t c) { return rows * c >= detail::kParallelMin && rows > 1; }

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t c, double eps) {
#pragma omp parallel for schedule(static) if (parallel_rows(rows, c))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * c;
    double sum = 0;
    for (std::int64_t j = 0; j < c; ++j) sum += xr[j];
    const double m = sum / static_cast<double>(c);
    double squares = 0;
    for (std::int64_t j = 0; j < c; ++j) squares += (xr[j] - m) * (xr[j] - m);
    const double inv = 1.0 / std::sqrt(squares / static_cast<double>(c) + eps);
    mean[r] = static_cast<T>(m);
    rstd[r] = static_cast<T>(inv);
    const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
    T* yr = y + r * c;
    if (bias != nullptr) {
      for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - tm) * ti * gain[j] + bias[j];
    } else {
      for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - tm) * ti * gain[j];
    }
  }
}

template <typename T>
void layer_norm_backward(const T* x, const T* dy, const T* gain, const T* mean, const T* rstd, T* dx, T* dgain,
                         T* dbias, std::int64_t rows, std::int64_t c) {
  const std::int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // per block: c sums of dy xhat, then c sums of dy
  std::vector<double> partial(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1) * 2 * c), 0.0);
#pragma omp parallel for schedule(static) if (parallel_rows(rows, c))
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    double* sum_xhat = partial.data() + blk * 2 * c;
    double* sum_dy = sum_xhat + c;
    const std::int64_t end = std::min(rows, (blk + 1) * kRowBlock);
    for (std::int64_t r = blk * kRowBlock; r < end; ++r) {
      const T* xr = x + r * c;
      const T* dyr = dy + r * c;
      const T tm = mean[r], ti = rstd[r];
      double mean_g = 0, mean_g_xhat = 0;
      for (std::int64_t j = 0; j < c; ++j) {
        const T xhat = (xr[j] - tm) * ti;
        const double g = static_cast<double>(dyr[j]) * gain[j];
        mean_g += g;
        mean_g_xhat += g * xhat;
        sum_xhat[j] += static_cast<double>(dyr[j]) * xhat;
        sum_dy[j] += dyr[j];
      }
      mean_g /= static_cast<double>(c);
      mean_g_xhat /= static_cast<double>(c);
      T* dxr = dx + r * c;
      for (std::int64_t j = 0; j < c; ++j) {  // dx may alias dy: each value is read before it is written
        const double xhat = (xr[j] - tm) * ti;
        const double g = static_cast<double>(dyr[j]) * gain[j];
        dxr[j] = static_cast<T>(static_cast<double>(ti) * (g - mean_g - xhat * mean_g_xhat));
      }
    }
  }
  for (std::int64_t j = 0; j < c; ++j) {
    double g = 0, b = 0;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      g += partial[blk * 2 * c + j];
      b += partial[blk * 2 * c + c + j];
    }
    dgain[j] = static_cast<T>(g);
    if (dbias != nullptr) dbias[j] = static_cast<T>(b);
  }
}

#define SPARKGRAD_LAYER_NORM(T)                                                                                \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, T*, T*, std::int64_t, std::int64_t,   \
                                      double);                                                               \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*,           \
                                       std::int64_t, std::int64_t);
SPARKGRAD_LAYER_NORM(float)
SPARKGRAD_LAYER_NORM(double)

}  // namespace sparkgrad::nn
