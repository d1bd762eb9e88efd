// Embedding lookup: a gather forward, a scatter-add backward. The backward gives each thread the rows
// r with r % threads == its number and walks the positions in order, so every row's sum has the same
// order for any thread count (no atomics, no sort).
#include <omp.h>

#include "kernel_util.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// {position, index} of the first index outside [0, vocab), or {-1, 0}; true when there is one (a serial
// scan: n is a minibatch's lookups).
bool first_out_of_range(const std::int64_t* indices, std::int64_t n, std::int64_t vocab, std::int64_t* first_bad) {
  first_bad[0] = -1;
  first_bad[1] = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= vocab) {
      first_bad[0] = i;
      first_bad[1] = indices[i];
      return true;
    }
  }
  return false;
}

}  // namespace

// indices: (n); w: (vocab, dim); y: (n, dim).
template <typename T>
void embedding_forward(const std::int64_t* indices, const T* w, T* y, std::int64_t n, std::int64_t vocab,
                       std::int64_t dim, std::int64_t* first_bad) {
  if (first_out_of_range(indices, n, vocab, first_bad)) return;
#pragma omp parallel for schedule(static) if (n * dim >= detail::kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    const T* src = w + indices[i] * dim;
    T* dst = y + i * dim;
    for (std::int64_t j = 0; j < dim; ++j) dst[j] = src[j];
  }
}

// indices: (n); dy: (n, dim); dw: (vocab, dim), accumulated.
template <typename T>
void embedding_backward(const std::int64_t* indices, const T* dy, T* dw, std::int64_t n, std::int64_t vocab,
                        std::int64_t dim, std::int64_t* first_bad) {
  if (first_out_of_range(indices, n, vocab, first_bad)) return;
#pragma omp parallel if (n * dim >= detail::kParallelMin)
  {
    const std::int64_t owners = omp_get_num_threads(), me = omp_get_thread_num();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t row = indices[i];
      if (row % owners != me) continue;
      const T* src = dy + i * dim;
      T* dst = dw + row * dim;
      for (std::int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    }
  }
}

#define SPARKGRAD_EMBEDDING(T)                                                                            \
  template void embedding_forward<T>(const std::int64_t*, const T*, T*, std::int64_t, std::int64_t,    \
                                     std::int64_t, std::int64_t*);                                      \
  template void embedding_backward<T>(const std::int64_t*, const T*, T*, std::int64_t, std::int64_t,   \
                                      std::int64_t, std::int64_t*);
SPARKGRAD_EMBEDDING(float)
SPARKGRAD_EMBEDDING(double)

}  // namespace sparkgrad::nn
