// CUDA twin of cpp/src/nn/vertex.cpp: element-wise combination of k inputs (one thread per element, the
// inputs' device pointers copied to a device table), scale and shift, and the row-wise L2 normalization and
// L2 distance (one block per row, sums of squares in double as on the CPU).
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// Index of the first maximal input at element e (the CPU's rule: ties go to the lowest index).
template <typename T>
__device__ std::int64_t argmax_at(const T* const* inputs, std::int64_t k, std::int64_t e) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < k; ++i) {
    if (inputs[i][e] > inputs[best][e]) best = i;
  }
  return best;
}

// Copies a host table of k device pointers into `table`.
template <typename P>
void upload_table(const char* op, const DeviceBuffer<P>& table, const P* host, std::int64_t k) {
  copy_to_device(op, table.get(), host, sizeof(P) * static_cast<std::size_t>(k));
}

// std::max(a, b) of the CPU kernels, NaN propagation included (fmax would drop a NaN a).
__device__ inline double std_max(double a, double b) { return a < b ? b : a; }

// inputs: k x (size), y: (size); scale multiplies the sum (1 / k for Average).
template <typename T>
__global__ void elementwise_forward_kernel(ElementWiseOp kind, const T* const* inputs, std::int64_t k, T scale,
                                           T* y, std::int64_t size) {
  for (std::int64_t e = first_index(); e < size; e += grid_stride()) {
    switch (kind) {
      case ElementWiseOp::Add:
      case ElementWiseOp::Average: {
        T sum = inputs[0][e];
        for (std::int64_t i = 1; i < k; ++i) sum += inputs[i][e];
        y[e] = sum * scale;
        break;
      }
      case ElementWiseOp::Subtract:
        y[e] = inputs[0][e] - inputs[1][e];
        break;
      case ElementWiseOp::Product: {
        T prod = inputs[0][e];
        for (std::int64_t i = 1; i < k; ++i) prod *= inputs[i][e];
        y[e] = prod;
        break;
      }
      case ElementWiseOp::Max:
        y[e] = inputs[argmax_at(inputs, k, e)][e];
        break;
    }
  }
}

// inputs, dx: k x (size), dy: (size).
template <typename T>
__global__ void elementwise_backward_kernel(ElementWiseOp kind, const T* const* inputs, std::int64_t k, T scale,
                                            const T* dy, T* const* dx, std::int64_t size) {
  for (std::int64_t e = first_index(); e < size; e += grid_stride()) {
    switch (kind) {
      case ElementWiseOp::Add:
      case ElementWiseOp::Average: {
        const T g = dy[e] * scale;
        for (std::int64_t i = 0; i < k; ++i) dx[i][e] = g;
        break;
      }
      case ElementWiseOp::Subtract:
        dx[0][e] = dy[e];
        dx[1][e] = -dy[e];
        break;
      case ElementWiseOp::Product:
        // The product of the other inputs, recomputed per input: no division, so zeros are exact.
        for (std::int64_t i = 0; i < k; ++i) {
          T others = dy[e];
          for (std::int64_t j = 0; j < k; ++j) {
            if (j != i) others *= inputs[j][e];
          }
          dx[i][e] = others;
        }
        break;
      case ElementWiseOp::Max: {
        const std::int64_t best = argmax_at(inputs, k, e);
        for (std::int64_t i = 0; i < k; ++i) dx[i][e] = i == best ? dy[e] : T(0);
        break;
      }
    }
  }
}

template <typename T>
__global__ void scale_shift_kernel(const T* x, T* y, std::int64_t size, T scale, T shift) {
  for (std::int64_t e = first_index(); e < size; e += grid_stride()) y[e] = x[e] * scale + shift;
}

// Blocks for one block per row (the row kernels loop over rows with a grid stride).
unsigned row_blocks(std::int64_t n) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(n, kMaxGrid)));
}

// x, y: (n, d), norms: (n); one block per row.
template <typename T>
__global__ void l2_normalize_forward_kernel(const T* x, T* y, T* norms, std::int64_t n, std::int64_t d,
                                            double eps) {
  for (std::int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = x + i * d;
    double sq = 0.0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) sq += static_cast<double>(row[j]) * row[j];
    const double norm = std_max(sqrt(block_sum(sq)), eps);
    if (threadIdx.x == 0) norms[i] = static_cast<T>(norm);
    const double inv = 1.0 / norm;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) y[i * d + j] = static_cast<T>(row[j] * inv);
  }
}

// y, dy, dx: (n, d), norms: (n); a norm clamped to eps is the constant eps: y = x / eps is linear there.
template <typename T>
__global__ void l2_normalize_backward_kernel(const T* y, const T* norms, const T* dy, T* dx, std::int64_t n,
                                             std::int64_t d, double eps) {
  for (std::int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* yr = y + i * d;
    const T* gr = dy + i * d;
    const double norm = norms[i];
    double dot = 0.0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += static_cast<double>(gr[j]) * yr[j];
    dot = block_sum(dot);  // every thread of the block reaches it: the branch below is per row
    if (!(norm > eps)) dot = 0.0;
    const double inv = 1.0 / norm;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      dx[i * d + j] = static_cast<T>((gr[j] - yr[j] * dot) * inv);
    }
  }
}

// a, b: (n, d), y: (n); one block per row.
template <typename T>
__global__ void l2_distance_forward_kernel(const T* a, const T* b, T* y, std::int64_t n, std::int64_t d) {
  for (std::int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    double sq = 0.0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double diff = static_cast<double>(a[i * d + j]) - b[i * d + j];
      sq += diff * diff;
    }
    sq = block_sum(sq);
    if (threadIdx.x == 0) y[i] = static_cast<T>(sqrt(sq));
  }
}

// a, b, da, db: (n, d), y, dy: (n); one thread per element.
template <typename T>
__global__ void l2_distance_backward_kernel(const T* a, const T* b, const T* y, const T* dy, T* da, T* db,
                                            std::int64_t n, std::int64_t d, double eps) {
  for (std::int64_t e = first_index(); e < n * d; e += grid_stride()) {
    const std::int64_t i = e / d;
    const double scale = dy[i] / std_max(static_cast<double>(y[i]), eps);
    const T g = static_cast<T>((static_cast<double>(a[e]) - b[e]) * scale);
    da[e] = g;
    db[e] = -g;
  }
}

template <typename T>
T sum_scale(ElementWiseOp kind, std::int64_t k) {
  return kind == ElementWiseOp::Average ? static_cast<T>(1.0 / static_cast<double>(k)) : T(1);
}

}  // namespace

template <typename T>
void elementwise_forward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, T* y, std::int64_t size) {
  const char* op = "elementwise_forward";
  if (size == 0) return;
  DeviceBuffer<const T*> table(op, k);
  upload_table(op, table, inputs, k);
  elementwise_forward_kernel<<<blocks_for(size), kThreads, 0, gpu::current_stream()>>>(kind, table.get(), k, sum_scale<T>(kind, k), y, size);
  check_kernels(op);
}

template <typename T>
void elementwise_backward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, const T* dy, T* const* dx,
                          std::int64_t size) {
  const char* op = "elementwise_backward";
  if (size == 0) return;
  DeviceBuffer<const T*> in_table(op, k);
  DeviceBuffer<T*> dx_table(op, k);
  upload_table(op, in_table, inputs, k);
  upload_table(op, dx_table, dx, k);
  elementwise_backward_kernel<<<blocks_for(size), kThreads, 0, gpu::current_stream()>>>(kind, in_table.get(), k, sum_scale<T>(kind, k), dy,
                                                              dx_table.get(), size);
  check_kernels(op);
}

template <typename T>
void scale_shift(const T* x, T* y, std::int64_t size, double scale, double shift) {
  if (size == 0) return;
  scale_shift_kernel<<<blocks_for(size), kThreads, 0, gpu::current_stream()>>>(x, y, size, static_cast<T>(scale), static_cast<T>(shift));
  check_kernels("scale_shift");
}

template <typename T>
void l2_normalize_forward(const T* x, T* y, T* norms, std::int64_t n, std::int64_t d, double eps) {
  if (n == 0) return;
  l2_normalize_forward_kernel<<<row_blocks(n), kThreads, 0, gpu::current_stream()>>>(x, y, norms, n, d, eps);
  check_kernels("l2_normalize_forward");
}

template <typename T>
void l2_normalize_backward(const T* y, const T* norms, const T* dy, T* dx, std::int64_t n, std::int64_t d,
                           double eps) {
  if (n == 0) return;
  l2_normalize_backward_kernel<<<row_blocks(n), kThreads, 0, gpu::current_stream()>>>(y, norms, dy, dx, n, d, eps);
  check_kernels("l2_normalize_backward");
}

template <typename T>
void l2_distance_forward(const T* a, const T* b, T* y, std::int64_t n, std::int64_t d) {
  if (n == 0) return;
  l2_distance_forward_kernel<<<row_blocks(n), kThreads, 0, gpu::current_stream()>>>(a, b, y, n, d);
  check_kernels("l2_distance_forward");
}

template <typename T>
void l2_distance_backward(const T* a, const T* b, const T* y, const T* dy, T* da, T* db, std::int64_t n,
                          std::int64_t d, double eps) {
  if (n * d == 0) return;
  l2_distance_backward_kernel<<<blocks_for(n * d), kThreads, 0, gpu::current_stream()>>>(a, b, y, dy, da, db, n, d, eps);
  check_kernels("l2_distance_backward");
}

#define SPARKGRAD_VERTEX(T)                                                                                   \
  template void elementwise_forward<T>(ElementWiseOp, const T* const*, std::int64_t, T*, std::int64_t);     \
  template void elementwise_backward<T>(ElementWiseOp, const T* const*, std::int64_t, const T*, T* const*, \
                                        std::int64_t);                                                      \
  template void scale_shift<T>(const T*, T*, std::int64_t, double, double);                                \
  template void l2_normalize_forward<T>(const T*, T*, T*, std::int64_t, std::int64_t, double);             \
  template void l2_normalize_backward<T>(const T*, const T*, const T*, T*, std::int64_t, std::int64_t,     \
                                         double);                                                           \
  template void l2_distance_forward<T>(const T*, const T*, T*, std::int64_t, std::int64_t);                \
  template void l2_distance_backward<T>(const T*, const T*, const T*, const T*, T*, T*, std::int64_t,      \
                                        std::int64_t, double);
SPARKGRAD_VERTEX(float)
SPARKGRAD_VERTEX(double)

}  // namespace sparkgrad::nn::cuda
