// CUDA twin of cpp/src/compress/threshold.cpp in one pass over the residual: CUB's single-pass ordered
// selection (decoupled look-back) compacts the entries of the qualifying elements, in ascending index
// order, into a worst-case buffer and counts them; the commit step then touches only the selected
// elements. The caller picks the format (or a boundary) from the count in between, so the residual
// changes only for what is sent.
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;

// The sparse entry of element i (+-(i+1) by its sign, as sparse_entry), or 0 when |x[i]| < t or NaN.
template <typename T>
struct EntryOf {
  const T* x;
  T t;
  __host__ __device__ std::int32_t operator()(std::int64_t i) const {
    const auto b = to_bits(x[i]);
    if (!at_least(b & ~FloatBits<T>::kSign, to_bits(t), FloatBits<T>::kInf)) return 0;
    const auto id = static_cast<std::int32_t>(i + 1);
    return (b & FloatBits<T>::kSign) ? -id : id;
  }
};

struct NonZero {
  __host__ __device__ bool operator()(std::int32_t e) const { return e != 0; }
};

// x[|e| - 1] -= +-t for the entries e of payload: (entries,), as sparse_entry moves each encoded element.
template <typename T>
__global__ void subtract_sent(T* x, T t, const std::int32_t* payload, std::int64_t entries) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j >= entries) return;
  const std::int32_t e = payload[j];
  const std::int64_t i = (e < 0 ? -static_cast<std::int64_t>(e) : e) - 1;
  x[i] -= from_bits<T>(to_bits(t) | (e < 0 ? FloatBits<T>::kSign : 0));
}

}  // namespace

template <typename T>
std::int64_t threshold_select(const T* x, std::int64_t n, double threshold, std::int32_t* message) {
  const char* op = "threshold_encode";
  if (n == 0) return 0;
  const T t = static_cast<T>(static_cast<float>(threshold));
  const auto in = thrust::make_transform_iterator(thrust::make_counting_iterator<std::int64_t>(0), EntryOf<T>{x, t});
  const cudaStream_t stream = gpu::current_stream();
  std::int32_t* entries = message + kHeaderWords;
  DeviceBuffer<std::int64_t> count(op, 1);
  std::size_t temp_bytes = 0;
  check_cuda(op, cub::DeviceSelect::If(nullptr, temp_bytes, in, entries, count.get(), n, NonZero{}, stream));
  DeviceBuffer<unsigned char> temp(op, static_cast<std::int64_t>(temp_bytes));
  check_cuda(op, cub::DeviceSelect::If(temp.get(), temp_bytes, in, entries, count.get(), n, NonZero{}, stream));
  check_kernels(op);
  std::int64_t total = 0;
  copy_to_host(op, &total, count.get(), sizeof total);
  return total;
}

template <typename T>
void threshold_commit(T* x, std::int64_t n, double threshold, std::int64_t entries, std::int32_t* message) {
  const char* op = "threshold_encode";
  const float tf = static_cast<float>(threshold);
  const std::int32_t header[kHeaderWords] = {static_cast<std::int32_t>(entries), static_cast<std::int32_t>(n),
                                             threshold_bits(tf), kFlagSparse};
  copy_to_device(op, message, header, sizeof header);
  if (entries > 0) {
    subtract_sent<<<grid_for(entries, kBlock), kBlock, 0, gpu::current_stream()>>>(x, static_cast<T>(tf),
                                                                                   message + kHeaderWords, entries);
  }
  check_kernels(op);
}

template std::int64_t threshold_select<float>(const float*, std::int64_t, double, std::int32_t*);
template std::int64_t threshold_select<double>(const double*, std::int64_t, double, std::int32_t*);
template void threshold_commit<float>(float*, std::int64_t, double, std::int64_t, std::int32_t*);
template void threshold_commit<double>(double*, std::int64_t, double, std::int64_t, std::int32_t*);

}  // namespace sparkgrad::compress::cuda
