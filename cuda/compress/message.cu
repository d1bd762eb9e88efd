// CUDA twin of cpp/src/compress/message.cpp: the header is checked on the host (same code as the CPU
// path), entries on the device; decoding (and subtracting) starts only after the whole message is valid.
#include <climits>
#include <vector>

#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;

// first_bad = min k with entries[k] outside +-[1, n]; entries: (count,).
__global__ void find_bad_entry(const std::int32_t* entries, std::int64_t count, std::int64_t n,
                               unsigned long long* first_bad) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < count && entry_out_of_range(entries[k], n)) atomicMin(first_bad, static_cast<unsigned long long>(k));
}

// target[|v| - 1] += +-t per entry; atomics because a valid message may repeat an index.
template <typename T>
__global__ void sparse_decode(const std::int32_t* entries, std::int64_t count, T t, T* target) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const std::int32_t v = entries[k];
  if (v > 0) {
    atomicAdd(target + (v - 1), t);
  } else {
    atomicAdd(target + (-static_cast<std::int64_t>(v) - 1), -t);
  }
}

// descents += 1 for each entries[k] addressing a lower index than entries[k - 1]; entries: (count,).
__global__ void count_descents(const std::int32_t* entries, std::int64_t count, unsigned long long* descents) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k > 0 && k < count && entry_index(entries[k]) < entry_index(entries[k - 1])) atomicAdd(descents, 1ull);
}

// One thread per entry; the first entry of each index's run subtracts the run (subtract_run): no atomics,
// each element is written by one thread. entries: (count,), equal indices adjacent.
template <typename T>
__global__ void sparse_subtract(const std::int32_t* entries, std::int64_t count, T t, T* target) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < count) subtract_run(entries, count, k, t, target);
}

// One thread per 16-element word; words: (n / 16 + 1,).
template <typename T>
__global__ void bitmap_decode(const std::int32_t* words, std::int64_t n, T t, T h, T* target) {
  const std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w > n / 16) return;
  const auto word = static_cast<std::uint32_t>(words[w]);
  const std::int64_t begin = w * 16;
  const std::int64_t len = n - begin < 16 ? n - begin : 16;
  for (std::int64_t j = 0; j < len; ++j) {
    const std::uint32_t code = ((word >> j) & 1u) | (((word >> (j + 16)) & 1u) << 1);
    // code 0 leaves the target bit-exact (the CPU adds -0, which keeps a NaN's payload; a GPU would not)
    if (code != 0) target[begin + j] += from_bits<T>(bitmap_sent(code, t, h, FloatBits<T>::kSign));
  }
}

}  // namespace

template <typename T>
void decode(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n,
            std::int32_t expected_flag) {
  std::int32_t header[kHeaderWords] = {0, 0, 0, 0};
  if (len >= kHeaderWords) copy_to_host(op, header, msg, sizeof header);
  validate_header(op, header, len, n, expected_flag);
  const T t = static_cast<T>(bits_threshold(header[2]));
  const std::int32_t* payload = msg + kHeaderWords;
  const std::int64_t words = len - kHeaderWords;
  if (header[3] == kFlagBitmap) {
    std::int32_t last = 0;
    copy_to_host(op, &last, msg + len - 1, sizeof last);
    validate_bitmap_tail(op, last, n);
    bitmap_decode<<<grid_for(words, kBlock), kBlock, 0, gpu::current_stream()>>>(payload, n, t, t / 2, target);
    check_kernels(op);
    return;
  }
  if (words == 0) return;
  DeviceBuffer<unsigned long long> first_bad(op, 1);
  const unsigned long long none = ULLONG_MAX;
  copy_to_device(op, first_bad.get(), &none, sizeof none);
  find_bad_entry<<<grid_for(words, kBlock), kBlock, 0, gpu::current_stream()>>>(payload, words, n, first_bad.get());
  check_kernels(op);
  unsigned long long bad = 0;
  copy_to_host(op, &bad, first_bad.get(), sizeof bad);
  if (bad != none) {
    std::int32_t v = 0;
    copy_to_host(op, &v, payload + bad, sizeof v);
    throw_bad_entry(op, static_cast<std::int64_t>(bad), v, n);
  }
  sparse_decode<<<grid_for(words, kBlock), kBlock, 0, gpu::current_stream()>>>(payload, words, t, target);
  check_kernels(op);
}

template void decode<float>(const char*, const std::int32_t*, std::int64_t, float*, std::int64_t, std::int32_t);
template void decode<double>(const char*, const std::int32_t*, std::int64_t, double*, std::int64_t, std::int32_t);

template <typename T>
void subtract_sparse(const char* op, const std::int32_t* msg, std::int64_t len, T* target, std::int64_t n) {
  std::int32_t header[kHeaderWords] = {0, 0, 0, 0};
  if (len >= kHeaderWords) copy_to_host(op, header, msg, sizeof header);
  validate_header(op, header, len, n, kFlagSparse);
  const T t = static_cast<T>(bits_threshold(header[2]));
  const std::int32_t* entries = msg + kHeaderWords;
  const std::int64_t count = len - kHeaderWords;
  if (count == 0) return;
  // flags[0]: the first bad entry (ULLONG_MAX: none), flags[1]: descents in index order
  DeviceBuffer<unsigned long long> flags(op, 2);
  const unsigned long long init[2] = {ULLONG_MAX, 0};
  copy_to_device(op, flags.get(), init, sizeof init);
  find_bad_entry<<<grid_for(count, kBlock), kBlock, 0, gpu::current_stream()>>>(entries, count, n, flags.get());
  count_descents<<<grid_for(count, kBlock), kBlock, 0, gpu::current_stream()>>>(entries, count, flags.get() + 1);
  check_kernels(op);
  unsigned long long found[2] = {0, 0};
  copy_to_host(op, found, flags.get(), sizeof found);
  if (found[0] != ULLONG_MAX) {
    std::int32_t v = 0;
    copy_to_host(op, &v, entries + found[0], sizeof v);
    throw_bad_entry(op, static_cast<std::int64_t>(found[0]), v, n);
  }
  if (found[1] == 0) {
    sparse_subtract<<<grid_for(count, kBlock), kBlock, 0, gpu::current_stream()>>>(entries, count, t, target);
    check_kernels(op);
    return;
  }
  // Not ascending (no encoder writes that): sorted on the host, as the CPU does, then subtracted.
  std::vector<std::int32_t> host(static_cast<std::size_t>(count));
  copy_to_host(op, host.data(), entries, sizeof(std::int32_t) * host.size());
  const std::vector<std::int32_t> sorted = sorted_entries(host.data(), count);
  DeviceBuffer<std::int32_t> on_device(op, count);
  copy_to_device(op, on_device.get(), sorted.data(), sizeof(std::int32_t) * sorted.size());
  sparse_subtract<<<grid_for(count, kBlock), kBlock, 0, gpu::current_stream()>>>(on_device.get(), count, t, target);
  check_kernels(op);
}

template void subtract_sparse<float>(const char*, const std::int32_t*, std::int64_t, float*, std::int64_t);
template void subtract_sparse<double>(const char*, const std::int32_t*, std::int64_t, double*, std::int64_t);

}  // namespace sparkgrad::compress::cuda
