// CUDA twin of cpp/src/nn/embedding.cpp. The index check is one kernel (the first bad position by an
// atomic minimum, then one read-back); the backward gives thread (owner, j) column j of the rows r with
// r % owners == owner and walks the positions in order: the CPU's sums in the CPU's order, no atomics.
#include "kernel_util.cuh"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

// first: starts at n, ends at the smallest position whose index is outside [0, vocab).
__global__ void first_out_of_range_kernel(const std::int64_t* indices, std::int64_t n, std::int64_t vocab,
                                          unsigned long long* first) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    if (indices[i] < 0 || indices[i] >= vocab) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// {position, index} of the first out-of-range index, or {-1, 0}; true when there is one (waits for the
// check).
bool first_out_of_range(const char* op, const std::int64_t* indices, std::int64_t n, std::int64_t vocab,
                        std::int64_t* first_bad) {
  first_bad[0] = -1;
  first_bad[1] = 0;
  if (n == 0) return false;
  DeviceBuffer<unsigned long long> first(op, 1);
  const unsigned long long start = static_cast<unsigned long long>(n);
  copy_to_device(op, first.get(), &start, sizeof start);
  first_out_of_range_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(indices, n, vocab,
                                                                                    first.get());
  check_kernels(op);
  unsigned long long found = 0;
  copy_to_host(op, &found, first.get(), sizeof found);
  if (found == start) return false;
  first_bad[0] = static_cast<std::int64_t>(found);
  copy_to_host(op, &first_bad[1], indices + first_bad[0], sizeof first_bad[1]);
  return true;
}

// indices: (n); w: (vocab, dim); y: (n, dim).
template <typename T>
__global__ void embedding_forward_kernel(const std::int64_t* indices, const T* w, T* y, std::int64_t n,
                                         std::int64_t dim) {
  for (std::int64_t k = first_index(); k < n * dim; k += grid_stride()) {
    const std::int64_t i = k / dim, j = k % dim;
    y[k] = w[indices[i] * dim + j];
  }
}

// Thread (owner, j): dw[r, j] += dy[i, j] for the positions i in order whose row r % owners == owner.
template <typename T>
__global__ void embedding_backward_kernel(const std::int64_t* indices, const T* dy, T* dw, std::int64_t n,
                                          std::int64_t dim, std::int64_t owners) {
  for (std::int64_t k = first_index(); k < owners * dim; k += grid_stride()) {
    const std::int64_t owner = k / dim, j = k % dim;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = indices[i];
      if (row % owners == owner) dw[row * dim + j] += dy[i * dim + j];
    }
  }
}

}  // namespace

template <typename T>
void embedding_forward(const std::int64_t* indices, const T* w, T* y, std::int64_t n, std::int64_t vocab,
                       std::int64_t dim, std::int64_t* first_bad) {
  if (first_out_of_range("embedding_forward", indices, n, vocab, first_bad) || n * dim == 0) return;
  embedding_forward_kernel<<<blocks_for(n * dim), kThreads, 0, gpu::current_stream()>>>(indices, w, y, n, dim);
  check_kernels("embedding_forward");
}

template <typename T>
void embedding_backward(const std::int64_t* indices, const T* dy, T* dw, std::int64_t n, std::int64_t vocab,
                        std::int64_t dim, std::int64_t* first_bad) {
  if (first_out_of_range("embedding_backward", indices, n, vocab, first_bad) || n * dim == 0) return;
  // enough (owner, column) threads to fill the GPU; each scans the n indices (a minibatch's lookups)
  const std::int64_t owners = std::max<std::int64_t>(1, std::min<std::int64_t>(n, (1 << 16) / dim));
  embedding_backward_kernel<<<blocks_for(owners * dim), kThreads, 0, gpu::current_stream()>>>(indices, dy, dw, n,
                                                                                              dim, owners);
  check_kernels("embedding_backward");
}

#define SPARKGRAD_EMBEDDING(T)                                                                            \
  template void embedding_forward<T>(const std::int64_t*, const T*, T*, std::int64_t, std::int64_t,    \
                                     std::int64_t, std::int64_t*);                                      \
  template void embedding_backward<T>(const std::int64_t*, const T*, T*, std::int64_t, std::int64_t,   \
                                      std::int64_t, std::int64_t*);
SPARKGRAD_EMBEDDING(float)
SPARKGRAD_EMBEDDING(double)

}  // namespace sparkgrad::nn::cuda
