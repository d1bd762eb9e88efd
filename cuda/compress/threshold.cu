// CUDA twin of cpp/src/compress/threshold.cpp with one read of the residual. Each block takes a tile of
// consecutive elements, loads it with coalesced 16-byte loads, finds the qualifying elements and writes
// their entries, in ascending index order, to its own slice of the working buffer (one block scan orders
// them) together with its count, and a device-wide scan turns the tiles' counts into offsets. The caller
// picks the format (or a boundary) from the total in between; the commit then gathers the chosen
// entries from the tiles' slices into a message of exactly their size and moves only those elements, so
// the residual changes only for what is sent. (CUB's DeviceSelect over a transform iterator did this in one pass too,
// but could not vectorise its loads through the iterator: 35% of the H200's memory bandwidth at 2^27.)
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kLoads = 4;                    // 16-byte loads per thread and tile
constexpr int kFieldBits = 16;               // per-load counts packed in one 64-bit scan value
constexpr std::uint64_t kFieldMask = 0xffff;  // a field holds up to kBlock * 4 = 1024 entries

template <typename T>
struct Vector;  // the 16-byte load of T
template <>
struct Vector<float> {
  using type = float4;
};
template <>
struct Vector<double> {
  using type = double2;
};

template <typename T>
constexpr int kWidth = 16 / sizeof(T);  // elements per 16-byte load
template <typename T>
constexpr std::int64_t kTile = kSelectTile<T>;  // 4096 floats, 2048 doubles
static_assert(kTile<float> == kBlock * kLoads * kWidth<float> && kTile<double> == kBlock * kLoads * kWidth<double>);

// The sparse entry of element i (+-(i+1) by its sign, as sparse_entry), or 0 when |v| < t or NaN.
template <typename T>
__device__ std::int32_t entry_of(T v, typename FloatBits<T>::U t_bits, std::int64_t i) {
  const auto b = to_bits(v);
  if (!at_least(b & ~FloatBits<T>::kSign, t_bits, FloatBits<T>::kInf)) return 0;
  const auto id = static_cast<std::int32_t>(i + 1);
  return (b & FloatBits<T>::kSign) ? -id : id;
}

// Block b writes the entries of tile b (elements [b * kTile, (b + 1) * kTile) of x) to scratch[b * kTile ...]
// in ascending index order and their number to counts[b]. Load k of thread j covers the kWidth elements
// starting at tile + (k * kBlock + j) * kWidth: coalesced, and ascending in (k, j), so one exclusive scan
// of the per-load counts (packed in 16-bit fields) places every entry. `aligned`: x is 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kBlock) select_tiles(const T* x, std::int64_t n, typename FloatBits<T>::U t_bits,
                                                       bool aligned, std::int32_t* scratch, std::int32_t* counts) {
  constexpr int W = kWidth<T>;
  using Scan = cub::BlockScan<std::uint64_t, kBlock>;
  __shared__ typename Scan::TempStorage scan_storage;
  const std::int64_t tile = static_cast<std::int64_t>(blockIdx.x) * kTile<T>;
  T v[kLoads][W];
  if (aligned && tile + kTile<T> <= n) {  // a full aligned tile: all loads in flight before any is used
    const auto* vectors = reinterpret_cast<const typename Vector<T>::type*>(x + tile) + threadIdx.x;
    typename Vector<T>::type loaded[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) loaded[k] = __ldcs(vectors + k * kBlock);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) memcpy(v[k], &loaded[k], sizeof v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const std::int64_t first = tile + (std::int64_t{k} * kBlock + threadIdx.x) * W;
#pragma unroll
      for (int w = 0; w < W; ++w) v[k][w] = first + w < n ? x[first + w] : T(0);  // 0 never qualifies: t > 0
    }
  }
  std::int32_t entries[kLoads][W];
  std::uint64_t packed = 0;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const std::int64_t first = tile + (std::int64_t{k} * kBlock + threadIdx.x) * W;
    std::uint64_t count = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      entries[k][w] = entry_of(v[k][w], t_bits, first + w);
      count += entries[k][w] != 0;
    }
    packed |= count << (kFieldBits * k);
  }
  std::uint64_t before = 0;
  std::uint64_t totals = 0;
  Scan(scan_storage).ExclusiveSum(packed, before, totals);
  std::int32_t* out = scratch + tile;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    std::int64_t at = (before >> (kFieldBits * k)) & kFieldMask;
    for (int earlier = 0; earlier < k; ++earlier) at += (totals >> (kFieldBits * earlier)) & kFieldMask;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      if (entries[k][w] != 0) out[at++] = entries[k][w];
    }
  }
  if (threadIdx.x == 0) {
    std::int32_t total = 0;
    for (int k = 0; k < kLoads; ++k) total += static_cast<std::int32_t>((totals >> (kFieldBits * k)) & kFieldMask);
    counts[blockIdx.x] = total;
  }
}

// Each warp moves the entries of tiles warp, warp + warps, ... whose ranks are below `entries` from their
// scratch slices to their offsets in the payload (most tiles of a sparse message hold none: a block per
// tile would mostly schedule idle blocks).
template <typename T>
__global__ void __launch_bounds__(kBlock) gather_tiles(const std::int32_t* scratch, const std::int64_t* offsets,
                                                       std::int64_t tiles, std::int64_t entries,
                                                       std::int32_t* payload) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kBlock / 32);
  for (std::int64_t b = (static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x) / 32; b < tiles; b += warps) {
    const std::int64_t begin = offsets[b];
    const std::int64_t end = min(offsets[b + 1], entries);
    const std::int32_t* from = scratch + b * kTile<T>;
    for (std::int64_t j = begin + lane; j < end; j += 32) payload[j] = from[j - begin];
  }
}

// Writes the header and x[|e| - 1] -= +-t for the entries e of payload: (entries,), as sparse_entry moves
// each encoded element (the header as kernel arguments: no copy from pageable host memory).
template <typename T>
__global__ void commit_sent(T* x, T t, std::int32_t* message, std::int64_t entries, std::int32_t n_word,
                            std::int32_t threshold_word) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j == 0) {
    message[0] = static_cast<std::int32_t>(entries);
    message[1] = n_word;
    message[2] = threshold_word;
    message[3] = kFlagSparse;
  }
  if (j >= entries) return;
  const std::int32_t e = message[kHeaderWords + j];
  const std::int64_t i = (e < 0 ? -static_cast<std::int64_t>(e) : e) - 1;
  x[i] -= from_bits<T>(to_bits(t) | (e < 0 ? FloatBits<T>::kSign : 0));
}

// The parts of threshold_select's working buffer (layout: threshold_select_words).
template <typename T>
struct Work {
  std::int64_t tiles;
  std::int32_t* scratch;
  std::int32_t* counts;
  std::int64_t* offsets;
  Work(std::int32_t* work, std::int64_t n) : tiles((n + kTile<T> - 1) / kTile<T>), scratch(work) {
    counts = work + n;
    const std::int64_t counts_end = n + tiles + 1;
    offsets = reinterpret_cast<std::int64_t*>(work + counts_end + (counts_end & 1));
  }
};

}  // namespace

template <typename T>
std::int64_t threshold_select(const T* x, std::int64_t n, double threshold, std::int32_t* work) {
  const char* op = "threshold_encode";
  if (n == 0) return 0;
  const T t = static_cast<T>(static_cast<float>(threshold));
  const Work<T> w(work, n);
  const cudaStream_t stream = gpu::current_stream();
  fill_zero(op, w.counts + w.tiles, sizeof(std::int32_t));  // the extra count: its exclusive sum is the total
  const bool aligned = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  select_tiles<T><<<static_cast<unsigned>(w.tiles), kBlock, 0, stream>>>(x, n, to_bits(t), aligned, w.scratch,
                                                                         w.counts);
  std::size_t scan_bytes = 0;
  check_cuda(op, cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, w.counts, w.offsets, w.tiles + 1, stream));
  DeviceBuffer<unsigned char> scan_scratch(op, static_cast<std::int64_t>(scan_bytes));
  check_cuda(op, cub::DeviceScan::ExclusiveSum(scan_scratch.get(), scan_bytes, w.counts, w.offsets, w.tiles + 1,
                                               stream));
  check_kernels(op);
  std::int64_t total = 0;
  copy_to_host(op, &total, w.offsets + w.tiles, sizeof total);
  return total;
}

template <typename T>
void threshold_commit(T* x, std::int64_t n, double threshold, std::int64_t entries, const std::int32_t* work,
                      std::int32_t* message) {
  const char* op = "threshold_encode";
  const float tf = static_cast<float>(threshold);
  const cudaStream_t stream = gpu::current_stream();
  if (entries > 0) {
    const Work<T> w(const_cast<std::int32_t*>(work), n);
    constexpr std::int64_t kTilesPerWarp = 4;
    const std::int64_t warps = (w.tiles + kTilesPerWarp - 1) / kTilesPerWarp;
    gather_tiles<T><<<grid_for(warps * 32, kBlock), kBlock, 0, stream>>>(w.scratch, w.offsets, w.tiles, entries,
                                                                        message + kHeaderWords);
  }
  commit_sent<<<grid_for(entries > 0 ? entries : 1, kBlock), kBlock, 0, stream>>>(
      x, static_cast<T>(tf), message, entries, static_cast<std::int32_t>(n), threshold_bits(tf));
  check_kernels(op);
}

template std::int64_t threshold_select<float>(const float*, std::int64_t, double, std::int32_t*);
template std::int64_t threshold_select<double>(const double*, std::int64_t, double, std::int32_t*);
template void threshold_commit<float>(float*, std::int64_t, double, std::int64_t, const std::int32_t*,
                                      std::int32_t*);
template void threshold_commit<double>(double*, std::int64_t, double, std::int64_t, const std::int32_t*,
                                       std::int32_t*);

}  // namespace sparkgrad::compress::cuda
