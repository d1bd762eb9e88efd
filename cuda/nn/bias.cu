// CUDA twin of cpp/src/nn/bias.cpp: bias add over (n, c, inner) and the per-channel bias gradient, plus
// the deterministic per-channel sums it is made of (channel_sums, kernel_util.cuh), which the recurrent
// layers' bias gradients use too.
#include <algorithm>
#include <climits>

#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::detail::cuda {

namespace {

// Pass 1 of channel_sums for inner == 1 (a row-major (n, c) matrix): block (bx, chunk) sums the rows of
// its chunk for columns bx*32 .. bx*32+31, 32 threads across the columns (coalesced) and kRowThreads down
// the rows, then adds the kRowThreads partial sums in order.
constexpr int kRowThreads = kThreads / 32;
template <typename T>
__global__ void column_chunk_sums_kernel(const T* x, double* partial, std::int64_t n, std::int64_t c,
                                         std::int64_t rows_per_chunk) {
  __shared__ double sums[kRowThreads][32];
  const int lane = threadIdx.x % 32, row_thread = threadIdx.x / 32;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * 32 + lane;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t last = min(first + rows_per_chunk, n);
  double sum = 0.0;
  if (j < c) {
    for (std::int64_t i = first + row_thread; i < last; i += kRowThreads) sum += x[i * c + j];
  }
  sums[row_thread][lane] = sum;
  __syncthreads();
  if (row_thread == 0 && j < c) {
    double total = 0.0;
    for (int t = 0; t < kRowThreads; ++t) total += sums[t][lane];
    partial[static_cast<std::int64_t>(blockIdx.y) * c + j] = total;
  }
}

// Pass 1 of channel_sums for inner > 1: block (j, chunk) sums channel j over its chunk of images.
template <typename T>
__global__ void plane_chunk_sums_kernel(const T* x, double* partial, std::int64_t n, std::int64_t c,
                                        std::int64_t inner, std::int64_t images_per_chunk) {
  const std::int64_t j = blockIdx.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * images_per_chunk;
  const std::int64_t last = min(first + images_per_chunk, n);
  double sum = 0.0;
  for (std::int64_t i = first; i < last; ++i) {
    const T* plane = x + (i * c + j) * inner;
    for (std::int64_t e = threadIdx.x; e < inner; e += blockDim.x) sum += plane[e];
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[static_cast<std::int64_t>(blockIdx.y) * c + j] = sum;
}

// Pass 2: out[j] = the chunks' partial sums of channel j added in chunk order, rounded once.
template <typename T>
__global__ void add_chunks_kernel(const double* partial, T* out, std::int64_t chunks, std::int64_t c) {
  for (std::int64_t j = first_index(); j < c; j += grid_stride()) {
    double total = 0.0;
    for (std::int64_t k = 0; k < chunks; ++k) total += partial[k * c + j];
    out[j] = static_cast<T>(total);
  }
}

}  // namespace

template <typename T>
void channel_sums(const char* op, const T* x, T* out, std::int64_t n, std::int64_t c, std::int64_t inner) {
  if (c == 0) return;
  if (n == 0 || inner == 0) {
    fill_zero(op, out, sizeof(T) * static_cast<std::size_t>(c));
    check_kernels(op);
    return;
  }
  // Chunks of images: enough blocks to fill a large GPU (a one-block-per-channel sum of a 1024 x 4096
  // gradient ran 16 blocks), each summing a few thousand values at least, so that pass 2 stays short.
  constexpr std::int64_t kTargetBlocks = 4 * 132, kMinValuesPerBlock = 4096;
  const std::int64_t channel_blocks = inner == 1 ? (c + 31) / 32 : c;
  const std::int64_t values_per_image = inner == 1 ? std::min<std::int64_t>(c, 32) : inner;  // in one block
  const std::int64_t wanted = std::max<std::int64_t>(1, kTargetBlocks / channel_blocks);
  const std::int64_t affordable = std::max<std::int64_t>(1, n * values_per_image / kMinValuesPerBlock);
  const std::int64_t chunks_asked = std::min({wanted, affordable, n, std::int64_t{65535}});
  const std::int64_t per_chunk = (n + chunks_asked - 1) / chunks_asked;
  const std::int64_t chunks = (n + per_chunk - 1) / per_chunk;
  if (channel_blocks > UINT_MAX) throw_invalid(op, "too many channels for one grid: ", c);
  DeviceBuffer<double> partial(op, chunks * c);
  const cudaStream_t stream = gpu::current_stream();
  const dim3 grid(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(chunks));
  if (inner == 1) {
    column_chunk_sums_kernel<T><<<grid, kThreads, 0, stream>>>(x, partial.get(), n, c, per_chunk);
  } else {
    plane_chunk_sums_kernel<T><<<grid, kThreads, 0, stream>>>(x, partial.get(), n, c, inner, per_chunk);
  }
  check_cuda(op, cudaGetLastError());
  add_chunks_kernel<T><<<blocks_for(c), kThreads, 0, stream>>>(partial.get(), out, chunks, c);
  check_kernels(op);
}

template void channel_sums<float>(const char*, const float*, float*, std::int64_t, std::int64_t, std::int64_t);
template void channel_sums<double>(const char*, const double*, double*, std::int64_t, std::int64_t, std::int64_t);

}  // namespace sparkgrad::detail::cuda

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// x: (n, c, inner), b: (c); I: the index type (32-bit where every index fits: a 64-bit division costs
// several 32-bit ones, and this kernel does two per element).
template <typename T, typename I>
__global__ void bias_add_kernel(T* x, const T* b, I total, I c, I inner) {
  for (I e = static_cast<I>(first_index()); e < total; e += static_cast<I>(grid_stride())) x[e] += b[(e / inner) % c];
}

}  // namespace

template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner) {
  const std::int64_t total = n * c * inner;
  if (total == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  if (total + static_cast<std::int64_t>(kMaxGrid) * kThreads < INT32_MAX) {
    bias_add_kernel<T, std::int32_t><<<blocks_for(total), kThreads, 0, stream>>>(
        x, b, static_cast<std::int32_t>(total), static_cast<std::int32_t>(c), static_cast<std::int32_t>(inner));
  } else {
    bias_add_kernel<T, std::int64_t><<<blocks_for(total), kThreads, 0, stream>>>(x, b, total, c, inner);
  }
  check_kernels("bias_add");
}

template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner) {
  channel_sums("bias_grad", dy, db, n, c, inner);
}

#define SPARKGRAD_BIAS(T)                                                                \
  template void bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t);   \
  template void bias_grad<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t);
SPARKGRAD_BIAS(float)
SPARKGRAD_BIAS(double)

}  // namespace sparkgrad::nn::cuda
