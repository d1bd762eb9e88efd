// CUDA twin of cpp/src/nn/conv2d.cpp. Where cuDNN was built in and can compute the shape, it runs the
// convolution (conv2d_cudnn.cu) and one pass here adds the bias and relu. Otherwise: im2col + one cuBLAS GEMM (the same row-major call as on the CPU) for
// a chunk of images at once. The column matrix of a chunk is (c*r*s, images*p*q), so each pass is a single
// large GEMM rather than one small GEMM per image; the (k, images*p*q) product and the (images, k, p*q)
// layout of y and dy are exchanged by a permuting copy (with the bias added on the way out). col2im is a
// gather (one thread per input element, no atomics), and the weight gradient accumulates over the chunks
// in the GEMM (beta = 1), so every result is deterministic.
#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "kernel_util.cuh"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

#ifdef SPARKGRAD_HAS_CUDNN
#include "conv2d_cudnn.cuh"
#else
// Without cuDNN, conv2d_algorithm below never picks it: every convolution runs the own kernels.
namespace sparkgrad::nn::cuda::cudnn {
std::string unsupported(const Conv2dShape&) {
  return "sparkgrad was built without cuDNN (pip install nvidia-cudnn-cu13, then rebuild with SPARKGRAD_ENABLE_CUDA=ON)";
}
template <typename T>
bool forward(const Conv2dShape&, const T*, const T*, T*) { return false; }
template <typename T>
bool backward_input(const Conv2dShape&, const T*, const T*, T*) { return false; }
template <typename T>
bool backward_weight(const Conv2dShape&, const T*, const T*, T*) { return false; }
}  // namespace sparkgrad::nn::cuda::cudnn
#endif

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// Elements of scratch one chunk of images may take (256 MiB of float32): bounds the memory of a large
// batch at a few kernels per chunk.
constexpr std::int64_t kChunkElements = std::int64_t{1} << 26;

// Images per chunk when each image needs `per_image` scratch elements.
std::int64_t chunk_images(std::int64_t n, std::int64_t per_image) {
  return std::max<std::int64_t>(1, std::min(n, kChunkElements / std::max<std::int64_t>(per_image, 1)));
}

// The geometry in the kernels' index type I: 32-bit index arithmetic (divisions above all) where every
// index of a chunk fits, 64-bit otherwise; a 64-bit division costs several times a 32-bit one, and the
// layout kernels do a few per element.
template <typename I>
struct Geometry {
  I c, h, w, r, s, p, q, stride_h, stride_w, pad_top, pad_left;
  explicit Geometry(const Conv2dShape& g)
      : c(static_cast<I>(g.c)), h(static_cast<I>(g.h)), w(static_cast<I>(g.w)), r(static_cast<I>(g.r)),
        s(static_cast<I>(g.s)), p(static_cast<I>(g.p)), q(static_cast<I>(g.q)),
        stride_h(static_cast<I>(g.stride_h)), stride_w(static_cast<I>(g.stride_w)),
        pad_top(static_cast<I>(g.pad_top)), pad_left(static_cast<I>(g.pad_left)) {}
};

// x: (m, c, h, w) -> col: (c*r*s, m*p*q); positions outside the image read as zero.
template <typename T, typename I>
__global__ void im2col_kernel(Geometry<I> g, I m, const T* x, T* col) {
  const I pq = g.p * g.q, cols = m * pq, total = g.c * g.r * g.s * cols;
  for (I e = static_cast<I>(first_index()); e < total; e += static_cast<I>(grid_stride())) {
    const I row = e / cols, image = (e % cols) / pq, oh = (e % pq) / g.q, ow = e % g.q;
    const I c = row / (g.r * g.s), r = (row / g.s) % g.r, s = row % g.s;
    const I ih = oh * g.stride_h - g.pad_top + r, iw = ow * g.stride_w - g.pad_left + s;
    col[e] = (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? x[((image * g.c + c) * g.h + ih) * g.w + iw] : T(0);
  }
}

// col: (c*r*s, m*p*q) -> dx: (m, c, h, w), each element the sum of the column entries that read it.
template <typename T, typename I>
__global__ void col2im_kernel(Geometry<I> g, I m, const T* col, T* dx) {
  const I pq = g.p * g.q, cols = m * pq, image_size = g.c * g.h * g.w, total = m * image_size;
  for (I e = static_cast<I>(first_index()); e < total; e += static_cast<I>(grid_stride())) {
    const I image = e / image_size, c = (e / (g.h * g.w)) % g.c, ih = (e / g.w) % g.h, iw = e % g.w;
    T sum = 0;
    for (I r = 0; r < g.r; ++r) {
      const I oh_s = ih + g.pad_top - r;  // oh * stride_h
      if (oh_s < 0 || oh_s % g.stride_h != 0 || oh_s / g.stride_h >= g.p) continue;
      for (I s = 0; s < g.s; ++s) {
        const I ow_s = iw + g.pad_left - s;
        if (ow_s < 0 || ow_s % g.stride_w != 0 || ow_s / g.stride_w >= g.q) continue;
        sum += col[((c * g.r + r) * g.s + s) * cols + image * pq + (oh_s / g.stride_h) * g.q + ow_s / g.stride_w];
      }
    }
    dx[e] = sum;
  }
}

// product: (k, m*pq) -> y: (m, k, pq), plus b[k] when b is given (one add, as bias_add), then max(., 0)
// when relu.
template <typename T, typename I>
__global__ void to_images_kernel(const T* product, const T* b, bool relu, I k, I m, I pq, T* y) {
  const I total = m * k * pq;
  for (I e = static_cast<I>(first_index()); e < total; e += static_cast<I>(grid_stride())) {
    const I image = e / (k * pq), channel = (e / pq) % k, j = e % pq;
    T v = product[channel * m * pq + image * pq + j];
    if (b != nullptr) v += b[channel];
    y[e] = relu && !(v > T(0)) ? T(0) : v;
  }
}

// y: (images, k, pq) += b[k] when b is given, then max(., 0) when relu: cuDNN's output, in place. cuDNN
// takes fewer than 2^31 elements, so the indices are 32-bit.
template <typename T>
__global__ void bias_relu_kernel(T* y, const T* b, bool relu, std::int32_t k, std::int32_t pq, std::int32_t total) {
  for (std::int32_t e = static_cast<std::int32_t>(first_index()); e < total;
       e += static_cast<std::int32_t>(grid_stride())) {
    T v = y[e];
    if (b != nullptr) v += b[(e / pq) % k];
    y[e] = relu && !(v > T(0)) ? T(0) : v;
  }
}

// dy: (m, k, pq) -> out: (k, m*pq).
template <typename T, typename I>
__global__ void from_images_kernel(const T* dy, I k, I m, I pq, T* out) {
  const I total = m * k * pq;
  for (I e = static_cast<I>(first_index()); e < total; e += static_cast<I>(grid_stride())) {
    const I channel = e / (m * pq), image = (e / pq) % m, j = e % pq;
    out[e] = dy[(image * k + channel) * pq + j];
  }
}

// Whether every index of a chunk of m images (its input, column matrix and output) and the grid stride
// beyond the last one fit a 32-bit signed integer.
bool fits_int32(const Conv2dShape& g, std::int64_t m) {
  const std::int64_t pq = g.p * g.q, largest = std::max({g.c * g.r * g.s * m * pq, m * g.k * pq,
                                                         m * g.c * g.h * g.w});
  return largest + static_cast<std::int64_t>(kMaxGrid) * kThreads < INT32_MAX;
}

// The four layout kernels of a chunk, launched with 32- or 64-bit indices.
template <typename T>
struct Layout {
  Conv2dShape g;
  std::int64_t m;
  cudaStream_t stream;
  bool small = fits_int32(g, m);

  void im2col(const T* x, T* col) const {
    const std::int64_t total = g.c * g.r * g.s * m * g.p * g.q;
    if (small) {
      im2col_kernel<T, std::int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          Geometry<std::int32_t>(g), static_cast<std::int32_t>(m), x, col);
    } else {
      im2col_kernel<T, std::int64_t><<<blocks_for(total), kThreads, 0, stream>>>(Geometry<std::int64_t>(g), m, x,
                                                                                 col);
    }
  }
  void col2im(const T* col, T* dx) const {
    const std::int64_t total = m * g.c * g.h * g.w;
    if (small) {
      col2im_kernel<T, std::int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          Geometry<std::int32_t>(g), static_cast<std::int32_t>(m), col, dx);
    } else {
      col2im_kernel<T, std::int64_t><<<blocks_for(total), kThreads, 0, stream>>>(Geometry<std::int64_t>(g), m, col,
                                                                                 dx);
    }
  }
  void to_images(const T* product, const T* b, bool relu, T* y) const {
    const std::int64_t pq = g.p * g.q, total = m * g.k * pq;
    if (small) {
      to_images_kernel<T, std::int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          product, b, relu, static_cast<std::int32_t>(g.k), static_cast<std::int32_t>(m),
          static_cast<std::int32_t>(pq), y);
    } else {
      to_images_kernel<T, std::int64_t><<<blocks_for(total), kThreads, 0, stream>>>(product, b, relu, g.k, m, pq, y);
    }
  }
  void from_images(const T* dy, T* out) const {
    const std::int64_t pq = g.p * g.q, total = m * g.k * pq;
    if (small) {
      from_images_kernel<T, std::int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
          dy, static_cast<std::int32_t>(g.k), static_cast<std::int32_t>(m), static_cast<std::int32_t>(pq), out);
    } else {
      from_images_kernel<T, std::int64_t><<<blocks_for(total), kThreads, 0, stream>>>(dy, g.k, m, pq, out);
    }
  }
};

// Runs step(layout, first image of the chunk, col, k_side) for each chunk of images, with the chunk's
// scratch: col (c*r*s, m*p*q) and k_side (k, m*p*q), the GEMM's product or dy in that layout.
template <typename T, typename Step>
void by_chunks(const char* op, const Conv2dShape& g, Step step) {
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q;
  const std::int64_t chunk = chunk_images(g.n, (crs + g.k) * pq);
  DeviceBuffer<T> col(op, crs * chunk * pq), k_side(op, g.k * chunk * pq);
  const cudaStream_t stream = gpu::current_stream();
  for (std::int64_t i = 0; i < g.n; i += chunk) {
    step(Layout<T>{g, std::min(chunk, g.n - i), stream}, i, col.get(), k_side.get());
    check_cuda(op, cudaGetLastError());
  }
  check_kernels(op);
}

// What auto runs for one pass of one shape, element type and precision, measured on its first call.
enum class Runner : std::uint8_t { Cudnn, Own };
using PassKey = std::array<std::int64_t, 17>;  // device, pass, element size, precision, the 13 shape numbers
std::mutex runners_mutex;
std::map<PassKey, Runner>& runners() {
  static auto* chosen = new std::map<PassKey, Runner>();  // process lifetime, like cuDNN's plans
  return *chosen;
}

// Milliseconds the work run() queues on the calling thread's stream takes (waits for it).
template <typename Run>
float elapsed_ms(const char* op, Run run) {
  const cudaStream_t stream = gpu::current_stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(op, cudaEventCreate(&start));
  check_cuda(op, cudaEventCreate(&stop));
  float ms = 0.0f;
  const cudaError_t recorded = cudaEventRecord(start, stream);
  run();
  cudaError_t status = recorded != cudaSuccess ? recorded : cudaEventRecord(stop, stream);
  if (status == cudaSuccess) status = cudaEventSynchronize(stop);
  if (status == cudaSuccess) status = cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  check_cuda(op, status);
  return ms;
}

// Runs one pass of a convolution: cudnn_pass() (false: cuDNN has no algorithm for it) or own_pass(). An
// explicit algorithm runs as asked. Auto runs the own kernels where cuDNN cannot compute the shape, and
// elsewhere times both twice on the first call of each shape, pass, element type and precision and keeps
// the faster: cuDNN wins the large convolutions, while for small ones (the residual CNN's 16-channel 28x28
// planes at batch 64) a deterministic cuDNN algorithm can lose to one im2col GEMM. The choice is the
// process's: two processes may round differently where their timings differ (an explicit algorithm pins it).
template <typename T, typename CudnnPass, typename OwnPass>
void run_pass(const char* op, int pass, const Conv2dShape& g, ConvAlgorithm requested, CudnnPass cudnn_pass,
              OwnPass own_pass) {
  if (nn::cuda::conv2d_algorithm(op, g, requested) == ConvAlgorithm::Im2col) return own_pass();
  if (requested == ConvAlgorithm::Cudnn) {
    if (!cudnn_pass()) {
      throw_invalid(op, "algorithm 'cudnn': cuDNN has no deterministic algorithm for this convolution in this ",
                    "precision; use auto or im2col");
    }
    return;
  }
  int device = 0;
  check_cuda(op, cudaGetDevice(&device));
  const PassKey key{device,     pass,       sizeof(T),  static_cast<std::int64_t>(gpu::current_precision()),
                    g.n,        g.c,        g.h,        g.w,
                    g.k,        g.r,        g.s,        g.p,
                    g.q,        g.stride_h, g.stride_w, g.pad_top,
                    g.pad_left};
  std::optional<Runner> known;
  {
    std::lock_guard<std::mutex> lock(runners_mutex);
    const auto it = runners().find(key);
    if (it != runners().end()) known = it->second;
  }
  if (known) {
    if (*known == Runner::Own || !cudnn_pass()) own_pass();
    return;
  }
  Runner winner = Runner::Own;
  if (cudnn_pass()) {  // its first call finds cuDNN's algorithm; then both are timed twice, alternately
    float own_ms = elapsed_ms(op, own_pass), cudnn_ms = elapsed_ms(op, [&] { cudnn_pass(); });
    own_ms = std::min(own_ms, elapsed_ms(op, own_pass));
    cudnn_ms = std::min(cudnn_ms, elapsed_ms(op, [&] { cudnn_pass(); }));
    if (cudnn_ms <= own_ms) {
      winner = Runner::Cudnn;
    } else {
      own_pass();  // the result every later call of this shape gives, to the last bit
    }
  } else {
    own_pass();
  }
  std::lock_guard<std::mutex> lock(runners_mutex);
  runners().emplace(key, winner);
}

}  // namespace

// cuDNN where it can compute the shape (auto then measures which is faster: run_pass above), else the own
// kernels.
ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape& g, ConvAlgorithm requested) {
  if (requested == ConvAlgorithm::Winograd) {
    throw_invalid(op, "algorithm 'winograd' has no GPU kernel, use auto, cudnn or im2col");
  }
  if (requested == ConvAlgorithm::Im2col) return requested;
  const std::string why_not = cudnn::unsupported(g);
  if (why_not.empty()) return ConvAlgorithm::Cudnn;
  if (requested == ConvAlgorithm::Cudnn) throw_invalid(op, "algorithm 'cudnn': ", why_not, "; use auto or im2col");
  return ConvAlgorithm::Im2col;
}

// x: (n, c, h, w), weights: (k, c*r*s), b: (k) or null -> y: (n, k, p, q).
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y, bool relu,
                    ConvAlgorithm algorithm) {
  const char* op = "conv2d_forward";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, image = g.c * g.h * g.w;
  if (g.n == 0 || g.k == 0 || pq == 0) return;
  const auto with_cudnn = [&] {
    if (!cudnn::forward(g, x, weights, y)) return false;
    if (b != nullptr || relu) {
      const std::int64_t total = g.n * g.k * pq;
      bias_relu_kernel<T><<<blocks_for(total), kThreads, 0, gpu::current_stream()>>>(
          y, b, relu, static_cast<std::int32_t>(g.k), static_cast<std::int32_t>(pq), static_cast<std::int32_t>(total));
      check_kernels(op);
    }
    return true;
  };
  const auto with_own_kernels = [&] {
    by_chunks<T>(op, g, [&](const Layout<T>& chunk, std::int64_t i, T* col, T* product) {
      const std::int64_t cols = chunk.m * pq;
      chunk.im2col(x + i * image, col);
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::No, g.k, cols, crs, T(1), weights, crs, col, cols, T(0),
                              product, cols);
      chunk.to_images(product, b, relu, y + i * g.k * pq);
    });
  };
  run_pass<T>(op, 0, g, algorithm, with_cudnn, with_own_kernels);
}

// dy: (n, k, p, q), weights: (k, c*r*s), b: (c) or null -> dx: (n, c, h, w) + b, then relu.
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, const T* b, T* dx, bool relu,
                           ConvAlgorithm algorithm) {
  const char* op = "conv2d_backward_input";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, image = g.c * g.h * g.w;
  if (g.n * image == 0) return;
  const auto with_own_kernels = [&] {
    by_chunks<T>(op, g, [&](const Layout<T>& chunk, std::int64_t i, T* col, T* dy_t) {
      const std::int64_t cols = chunk.m * pq;
      if (cols > 0 && g.k > 0) chunk.from_images(dy + i * g.k * pq, dy_t);
      sparkgrad::gpu::gemm<T>(Transpose::Yes, Transpose::No, crs, cols, g.k, T(1), weights, crs, dy_t, cols, T(0),
                              col, cols);
      chunk.col2im(col, dx + i * image);
    });
  };
  run_pass<T>(op, 1, g, algorithm, [&] { return cudnn::backward_input(g, dy, weights, dx); }, with_own_kernels);
  if (b != nullptr || relu) {
    const std::int64_t total = g.n * image;
    bias_relu_kernel<T><<<blocks_for(total), kThreads, 0, gpu::current_stream()>>>(
        dx, b, relu, static_cast<std::int32_t>(g.c), static_cast<std::int32_t>(g.h * g.w),
        static_cast<std::int32_t>(total));
    check_kernels(op);
  }
}

// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c*r*s) = dy' col^T over all images, dy' = dy as (k, n*p*q).
template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw, ConvAlgorithm algorithm) {
  const char* op = "conv2d_backward_weight";
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, image = g.c * g.h * g.w;
  if (g.k * crs == 0) return;
  if (g.n == 0 || pq == 0) {
    fill_zero(op, dw, sizeof(T) * static_cast<std::size_t>(g.k * crs));
    check_kernels(op);
    return;
  }
  const auto with_own_kernels = [&] {
    by_chunks<T>(op, g, [&](const Layout<T>& chunk, std::int64_t i, T* col, T* dy_t) {
      const std::int64_t cols = chunk.m * pq;
      chunk.im2col(x + i * image, col);
      chunk.from_images(dy + i * g.k * pq, dy_t);
      sparkgrad::gpu::gemm<T>(Transpose::No, Transpose::Yes, g.k, crs, cols, T(1), dy_t, cols, col, cols,
                              i == 0 ? T(0) : T(1), dw, crs);
    });
  };
  run_pass<T>(op, 2, g, algorithm, [&] { return cudnn::backward_weight(g, x, dy, dw); }, with_own_kernels);
}

// The GPU's passes run back to back (each im2col is a kernel launch, not a pass over host memory): the
// CPU twin shares one im2col between them.
template <typename T>
void conv2d_forward_backward_weight(const Conv2dShape& g, const T* x, const T* weights, const T* dy, T* y, T* dw,
                                    ConvAlgorithm algorithm) {
  cuda::conv2d_backward_weight<T>(g, x, dy, dw, algorithm);  // qualified: ADL on Conv2dShape finds the CPU's too
  if (y != nullptr) cuda::conv2d_forward<T>(g, x, weights, nullptr, y, false, algorithm);
}

#define SPARKGRAD_CONV2D(T)                                                                            \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm); \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm); \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm);        \
  template void conv2d_forward_backward_weight<T>(const Conv2dShape&, const T*, const T*, const T*, T*, T*,  \
                                                  ConvAlgorithm);
SPARKGRAD_CONV2D(float)
SPARKGRAD_CONV2D(double)

}  // namespace sparkgrad::nn::cuda
