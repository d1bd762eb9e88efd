// CUDA twin of cpp/src/nn/pool2d.cpp. Forward: one thread per output. Backward gathers, one thread per
// input element, the outputs whose window covers it in ascending order (the CPU's summation order), so
// there are no atomics and the result is deterministic. Global pooling: one thread per plane.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

struct Range {
  std::int64_t begin, end;
};
// In-bounds input rows [begin, end) of output row i (same formula for columns).
__device__ Range window(std::int64_t i, std::int64_t stride, std::int64_t pad, std::int64_t kernel,
                        std::int64_t size) {
  const std::int64_t start = i * stride - pad;
  return {start > 0 ? start : 0, start + kernel < size ? start + kernel : size};
}
// Output rows [first, last) whose window holds input row r.
__device__ Range covering(std::int64_t r, std::int64_t stride, std::int64_t pad, std::int64_t kernel,
                          std::int64_t out) {
  const std::int64_t hi = r + pad;           // i * stride <= hi
  const std::int64_t lo = r + pad - kernel;  // i * stride > lo
  const std::int64_t first = lo < 0 ? 0 : lo / stride + 1;
  const std::int64_t last = hi < 0 ? 0 : hi / stride + 1;
  return {first, last < out ? last : out};
}

template <typename T>
__device__ T minus_infinity();
template <>
__device__ float minus_infinity<float>() { return __int_as_float(0xff800000); }
template <>
__device__ double minus_infinity<double>() { return __longlong_as_double(0xfff0000000000000LL); }

// x: (n, c, h, w) -> y, argmax: (n, c, p, q).
template <typename T>
__global__ void pool_forward_kernel(PoolKind kind, Pool2dShape g, const T* x, T* y, std::int64_t* argmax) {
  const std::int64_t total = g.n * g.c * g.p * g.q;
  for (std::int64_t out = first_index(); out < total; out += grid_stride()) {
    const std::int64_t plane = out / (g.p * g.q), i = (out / g.q) % g.p, j = out % g.q;
    const T* xp = x + plane * g.h * g.w;
    const Range rows = window(i, g.stride_h, g.pad_top, g.kernel_h, g.h);
    const Range cols = window(j, g.stride_w, g.pad_left, g.kernel_w, g.w);
    if (kind == PoolKind::Max) {
      T best = minus_infinity<T>();
      std::int64_t best_at = rows.begin * g.w + cols.begin;
      for (std::int64_t r = rows.begin; r < rows.end; ++r) {
        for (std::int64_t s = cols.begin; s < cols.end; ++s) {
          if (xp[r * g.w + s] > best) {
            best = xp[r * g.w + s];
            best_at = r * g.w + s;
          }
        }
      }
      y[out] = xp[best_at];
      argmax[out] = best_at;
    } else {
      T sum = 0;
      for (std::int64_t r = rows.begin; r < rows.end; ++r) {
        for (std::int64_t s = cols.begin; s < cols.end; ++s) sum += xp[r * g.w + s];
      }
      y[out] = sum / static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
    }
  }
}

// dy: (n, c, p, q) -> dx: (n, c, h, w); *bad = 1 (when bad is given) when an argmax value is out of range.
template <typename T>
__global__ void pool_backward_kernel(PoolKind kind, Pool2dShape g, const T* dy, T* dx, const std::int64_t* argmax,
                                     int* bad) {
  const std::int64_t total = g.n * g.c * g.h * g.w, in_size = g.h * g.w;
  for (std::int64_t e = first_index(); e < total; e += grid_stride()) {
    const std::int64_t plane = e / in_size, r = (e / g.w) % g.h, s = e % g.w;
    const Range out_rows = covering(r, g.stride_h, g.pad_top, g.kernel_h, g.p);
    const Range out_cols = covering(s, g.stride_w, g.pad_left, g.kernel_w, g.q);
    T sum = 0;
    for (std::int64_t i = out_rows.begin; i < out_rows.end; ++i) {
      for (std::int64_t j = out_cols.begin; j < out_cols.end; ++j) {
        const std::int64_t out = plane * g.p * g.q + i * g.q + j;
        if (kind == PoolKind::Max) {
          const std::int64_t at = argmax[out];
          if ((at < 0 || at >= in_size) && bad != nullptr) *bad = 1;
          if (at == r * g.w + s) sum += dy[out];
        } else {
          const Range rows = window(i, g.stride_h, g.pad_top, g.kernel_h, g.h);
          const Range cols = window(j, g.stride_w, g.pad_left, g.kernel_w, g.w);
          sum += dy[out] / static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
        }
      }
    }
    dx[e] = sum;
  }
}

// x: (planes, size) -> y, argmax: (planes); sums in double as on the CPU; max keeps the first maximum.
template <typename T>
__global__ void global_forward_kernel(PoolKind kind, const T* x, T* y, std::int64_t* argmax, std::int64_t planes,
                                      std::int64_t size) {
  for (std::int64_t plane = first_index(); plane < planes; plane += grid_stride()) {
    const T* xp = x + plane * size;
    if (kind == PoolKind::Max) {
      std::int64_t at = 0;
      for (std::int64_t e = 1; e < size; ++e) {
        if (xp[at] < xp[e]) at = e;
      }
      y[plane] = xp[at];
      argmax[plane] = at;
    } else {
      double sum = 0;
      for (std::int64_t e = 0; e < size; ++e) sum += xp[e];
      y[plane] = static_cast<T>(kind == PoolKind::Avg ? sum / static_cast<double>(size) : sum);
    }
  }
}

// dy: (planes) -> dx: (planes, size).
template <typename T>
__global__ void global_backward_kernel(PoolKind kind, const T* dy, T* dx, const std::int64_t* argmax,
                                       std::int64_t planes, std::int64_t size, int* bad) {
  for (std::int64_t e = first_index(); e < planes * size; e += grid_stride()) {
    const std::int64_t plane = e / size;
    if (kind == PoolKind::Max) {
      const std::int64_t at = argmax[plane];
      if ((at < 0 || at >= size) && bad != nullptr) *bad = 1;
      dx[e] = at == e % size ? dy[plane] : T(0);
    } else {
      dx[e] = kind == PoolKind::Avg ? dy[plane] / static_cast<T>(size) : dy[plane];
    }
  }
}

// Runs `launch(flag)` and throws std::invalid_argument naming `op` when a kernel raised the flag. Reading
// the flag waits for the device, so the check runs with the debug switch (gpu::sync_each_op) only: the
// argmax comes from the forward pass, and an out-of-range value is only ever compared, never used as an
// index, so without the check it drops that gradient and reads nothing outside dx.
template <typename Launch>
void with_argmax_check(const char* op, std::int64_t limit, Launch launch) {
  if (!gpu::sync_each_op()) {
    launch(nullptr);
    check_kernels(op);
    return;
  }
  DeviceBuffer<int> bad(op, 1);
  fill_zero(op, bad.get(), sizeof(int));
  launch(bad.get());
  check_kernels(op);
  int flag = 0;
  copy_to_host(op, &flag, bad.get(), sizeof flag);
  if (flag) throw_invalid(op, "an argmax value is outside [0, ", limit, ")");
}

}  // namespace

template <typename T>
void pool2d_forward(PoolKind kind, const Pool2dShape& g, const T* x, T* y, std::int64_t* argmax) {
  const std::int64_t total = g.n * g.c * g.p * g.q;
  if (total == 0) return;
  pool_forward_kernel<<<blocks_for(total), kThreads, 0, gpu::current_stream()>>>(kind, g, x, y, argmax);
  check_kernels("pool2d_forward");
}

template <typename T>
void pool2d_backward(PoolKind kind, const Pool2dShape& g, const T* dy, T* dx, const std::int64_t* argmax) {
  const std::int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  with_argmax_check("pool2d_backward", g.h * g.w, [&](int* bad) {
    pool_backward_kernel<<<blocks_for(total), kThreads, 0, gpu::current_stream()>>>(kind, g, dy, dx, argmax, bad);
  });
}

template <typename T>
void global_pool_forward(PoolKind kind, const T* x, T* y, std::int64_t* argmax, std::int64_t planes,
                         std::int64_t size) {
  if (planes == 0) return;
  global_forward_kernel<<<blocks_for(planes), kThreads, 0, gpu::current_stream()>>>(kind, x, y, argmax, planes, size);
  check_kernels("global_pool_forward");
}

template <typename T>
void global_pool_backward(PoolKind kind, const T* dy, T* dx, const std::int64_t* argmax, std::int64_t planes,
                          std::int64_t size) {
  if (planes * size == 0) return;
  with_argmax_check("global_pool_backward", size, [&](int* bad) {
    global_backward_kernel<<<blocks_for(planes * size), kThreads, 0, gpu::current_stream()>>>(kind, dy, dx, argmax, planes, size, bad);
  });
}

#define SPARKGRAD_POOL(T)                                                                                      \
  template void pool2d_forward<T>(PoolKind, const Pool2dShape&, const T*, T*, std::int64_t*);                \
  template void pool2d_backward<T>(PoolKind, const Pool2dShape&, const T*, T*, const std::int64_t*);         \
  template void global_pool_forward<T>(PoolKind, const T*, T*, std::int64_t*, std::int64_t, std::int64_t);   \
  template void global_pool_backward<T>(PoolKind, const T*, T*, const std::int64_t*, std::int64_t, std::int64_t);
SPARKGRAD_POOL(float)
SPARKGRAD_POOL(double)

}  // namespace sparkgrad::nn::cuda
