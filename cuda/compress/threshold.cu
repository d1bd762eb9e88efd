// CUDA twin of cpp/src/compress/threshold.cpp: count per block, exclusive scan of the block counts,
// ordered compaction (warp ballots) so the payload is ascending, and the boundary keeps the lowest indices.
#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 512;  // elements (threads) per block
constexpr int kScan = 1024;  // threads of the single-block scan

template <typename T>
__device__ bool qualifies(const T* x, std::int64_t i, std::int64_t n, T t) {
  return i < n && abs(x[i]) >= t;
}

// counts[b] = #{qualifying elements of block b}; x: (n,), counts: (blocks,).
template <typename T>
__global__ void count_blocks(const T* x, std::int64_t n, T t, std::int32_t* counts) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int c = __syncthreads_count(qualifies(x, i, n, t));
  if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// offsets: (blocks + 1,) exclusive prefix sums of counts: (blocks,), one block scanning tile by tile.
__global__ void exclusive_scan(const std::int32_t* counts, std::int64_t blocks, std::int64_t* offsets) {
  __shared__ std::int64_t tile[kScan];
  __shared__ std::int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (std::int64_t base = 0; base < blocks; base += kScan) {
    const std::int64_t i = base + threadIdx.x;
    const std::int64_t v = i < blocks ? counts[i] : 0;
    tile[threadIdx.x] = v;
    __syncthreads();
    for (int step = 1; step < kScan; step <<= 1) {  // Hillis-Steele inclusive scan
      const std::int64_t add = threadIdx.x >= step ? tile[threadIdx.x - step] : 0;
      __syncthreads();
      tile[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < blocks) offsets[i] = carry + tile[threadIdx.x] - v;
    __syncthreads();
    if (threadIdx.x == kScan - 1) carry += tile[kScan - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[blocks] = carry;
}

// Writes the qualifying elements of each block at offsets[b] + rank-in-block, keeping positions < entries.
template <typename T>
__global__ void compact(T* x, std::int64_t n, T t, const std::int64_t* offsets, std::int64_t entries,
                        std::int32_t* payload) {
  __shared__ int warp_offset[kBlock / 32];
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const bool pred = qualifies(x, i, n, t);
  const unsigned ballot = __ballot_sync(0xffffffffu, pred);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_offset[warp] = __popc(ballot);
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int w = 0; w < kBlock / 32; ++w) {
      const int c = warp_offset[w];
      warp_offset[w] = sum;
      sum += c;
    }
  }
  __syncthreads();
  if (!pred) return;
  const std::int64_t pos = offsets[blockIdx.x] + warp_offset[warp] + __popc(ballot & ((1u << lane) - 1u));
  if (pos < entries) payload[pos] = sparse_entry(x[i], t, i);
}

// Block offsets of x: (n,) in `offsets` (blocks + 1 entries); returns the total count.
template <typename T>
std::int64_t scan_counts(const char* op, const T* x, std::int64_t n, T t, DeviceBuffer<std::int64_t>& offsets,
                         std::int64_t blocks) {
  DeviceBuffer<std::int32_t> counts(op, blocks);
  if (blocks > 0) count_blocks<<<static_cast<unsigned>(blocks), kBlock>>>(x, n, t, counts.get());
  exclusive_scan<<<1, kScan>>>(counts.get(), blocks, offsets.get());
  check_kernels(op);
  std::int64_t total = 0;
  check_cuda(op, cudaMemcpy(&total, offsets.get() + blocks, sizeof total, cudaMemcpyDeviceToHost));
  return total;
}

}  // namespace

template <typename T>
std::int64_t threshold_count(const T* x, std::int64_t n, double threshold) {
  const char* op = "threshold_encode";
  const std::int64_t blocks = grid_for(n, kBlock);
  DeviceBuffer<std::int64_t> offsets(op, blocks + 1);
  return scan_counts(op, x, n, static_cast<T>(static_cast<float>(threshold)), offsets, blocks);
}

template <typename T>
void threshold_encode(T* x, std::int64_t n, double threshold, std::int64_t entries, std::int32_t* out) {
  const char* op = "threshold_encode";
  const float tf = static_cast<float>(threshold);
  const T t = static_cast<T>(tf);
  const std::int64_t blocks = grid_for(n, kBlock);
  DeviceBuffer<std::int64_t> offsets(op, blocks + 1);
  const std::int64_t count = scan_counts(op, x, n, t, offsets, blocks);
  if (entries > count) throw_runtime(op, "residual changed between counting and encoding");
  const std::int32_t header[kHeaderWords] = {static_cast<std::int32_t>(entries), static_cast<std::int32_t>(n),
                                             threshold_bits(tf), kFlagSparse};
  check_cuda(op, cudaMemcpy(out, header, sizeof header, cudaMemcpyHostToDevice));
  if (entries > 0) {
    compact<<<static_cast<unsigned>(blocks), kBlock>>>(x, n, t, offsets.get(), entries, out + kHeaderWords);
  }
  check_kernels(op);
}

template std::int64_t threshold_count<float>(const float*, std::int64_t, double);
template std::int64_t threshold_count<double>(const double*, std::int64_t, double);
template void threshold_encode<float>(float*, std::int64_t, double, std::int64_t, std::int32_t*);
template void threshold_encode<double>(double*, std::int64_t, double, std::int64_t, std::int32_t*);

}  // namespace sparkgrad::compress::cuda
