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

// Independent partial sums of a row's statistics: one running double sum stalls on the add latency at
// every element; kLanes of them, added in a fixed order, vectorise and depend only on c.
constexpr std::int64_t kLanes = 8;

// The sum of term(j) for j < c, in double, over kLanes partial sums.
template <typename Term>
SPARKGRAD_FORCE_INLINE double lane_sum(std::int64_t c, Term term) {
  double acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= c; j += kLanes) {
    for (std::int64_t k = 0; k < kLanes; ++k) acc[k] += term(j + k);
  }
  for (std::int64_t k = 0; j < c; ++j, ++k) acc[k] += term(j);
  double sum = 0;
  for (std::int64_t k = 0; k < kLanes; ++k) sum += acc[k];
  return sum;
}

// One row of the forward (compiled per ISA: the row loops are the kernel).
template <typename T>
SPARKGRAD_SIMD_CLONES void forward_row(const T* xr, const T* gain, const T* bias, T* yr, T* mean, T* rstd,
                                       std::int64_t c, double eps) {
  const double m =
      lane_sum(c, [xr](std::int64_t j) { return static_cast<double>(xr[j]); }) / static_cast<double>(c);
  const double squares = lane_sum(c, [xr, m](std::int64_t j) {
    const double d = xr[j] - m;
    return d * d;
  });
  const double inv = 1.0 / std::sqrt(squares / static_cast<double>(c) + eps);
  *mean = static_cast<T>(m);
  *rstd = static_cast<T>(inv);
  const T tm = static_cast<T>(m), ti = static_cast<T>(inv);
  if (bias != nullptr) {
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - tm) * ti * gain[j] + bias[j];
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - tm) * ti * gain[j];
  }
}

// One row of the backward: its terms of the column sums (sum_xhat, sum_dy) and its dx, which may alias
// dy (each value is read before it is written).
template <typename T>
SPARKGRAD_SIMD_CLONES void backward_row(const T* xr, const T* dyr, const T* gain, T tm, T ti, T* dxr,
                                        double* sum_xhat, double* sum_dy, std::int64_t c) {
#pragma omp simd
  for (std::int64_t j = 0; j < c; ++j) {
    const T xhat = (xr[j] - tm) * ti;
    sum_xhat[j] += static_cast<double>(dyr[j]) * xhat;
    sum_dy[j] += dyr[j];
  }
  const double mean_g =
      lane_sum(c, [dyr, gain](std::int64_t j) { return static_cast<double>(dyr[j]) * gain[j]; }) /
      static_cast<double>(c);
  const double mean_g_xhat = lane_sum(c, [xr, dyr, gain, tm, ti](std::int64_t j) {
                               const T xhat = (xr[j] - tm) * ti;
                               return static_cast<double>(dyr[j]) * gain[j] * xhat;
                             }) /
                             static_cast<double>(c);
#pragma omp simd
  for (std::int64_t j = 0; j < c; ++j) {
    const double xhat = (xr[j] - tm) * ti;
    const double g = static_cast<double>(dyr[j]) * gain[j];
    dxr[j] = static_cast<T>(static_cast<double>(ti) * (g - mean_g - xhat * mean_g_xhat));
  }
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t c, double eps) {
#pragma omp parallel for schedule(static) if (parallel_rows(rows, c))
  for (std::int64_t r = 0; r < rows; ++r) {
    forward_row(x + r * c, gain, bias, y + r * c, mean + r, rstd + r, c, eps);
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
    const std::int64_t end = std::min(rows, (blk + 1) * kRowBlock);
    for (std::int64_t r = blk * kRowBlock; r < end; ++r) {
      backward_row(x + r * c, dy + r * c, gain, mean[r], rstd[r], dx + r * c, sum_xhat, sum_xhat + c, c);
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
