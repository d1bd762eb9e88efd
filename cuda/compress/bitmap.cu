// CUDA twin of cpp/src/compress/bitmap.cpp: one thread per 16-element word.
#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;

// words: (n / 16 + 1,) payload words; count accumulates the number of encoded elements.
template <typename T>
__global__ void encode_words(T* x, std::int64_t n, T t, T h, std::int32_t* words, unsigned long long* count) {
  const std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w > n / 16) return;
  const std::int64_t begin = w * 16;
  const std::int64_t len = n - begin < 16 ? n - begin : 16;
  std::uint32_t word = 0;
  unsigned encoded = 0;
  for (std::int64_t j = 0; j < len; ++j) {
    const std::uint32_t code = bitmap_code(x[begin + j], t, h);
    word |= ((code & 1u) << j) | ((code >> 1) << (j + 16));
    encoded += code != 0;
  }
  words[w] = static_cast<std::int32_t>(word);
  if (encoded != 0) atomicAdd(count, static_cast<unsigned long long>(encoded));
}

}  // namespace

template <typename T>
std::int64_t bitmap_encode(T* x, std::int64_t n, double threshold, std::int32_t* out) {
  const char* op = "bitmap_encode";
  const float tf = static_cast<float>(threshold);
  const T t = static_cast<T>(tf);
  const std::int32_t header[kHeaderWords] = {static_cast<std::int32_t>(n), static_cast<std::int32_t>(n),
                                             threshold_bits(tf), kFlagBitmap};
  copy_to_device(op, out, header, sizeof header);
  DeviceBuffer<unsigned long long> count(op, 1);
  fill_zero(op, count.get(), sizeof(unsigned long long));
  const std::int64_t words = bitmap_length(n) - kHeaderWords;
  encode_words<<<grid_for(words, kBlock), kBlock, 0, gpu::current_stream()>>>(x, n, t, t / 2, out + kHeaderWords, count.get());
  check_kernels(op);
  unsigned long long host = 0;
  copy_to_host(op, &host, count.get(), sizeof host);
  return static_cast<std::int64_t>(host);
}

template std::int64_t bitmap_encode<float>(float*, std::int64_t, double, std::int32_t*);
template std::int64_t bitmap_encode<double>(double*, std::int64_t, double, std::int32_t*);

}  // namespace sparkgrad::compress::cuda
