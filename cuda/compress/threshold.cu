// CUDA twin of cpp/src/compress/threshold.cpp in one pass over the residual. Blocks take tiles of
// consecutive elements by ticket (in the order they ask), load each with coalesced 16-byte loads, rank its
// qualifying elements with one block scan and learn how many the tiles before it hold by a decoupled
// look-back (Merrill & Garland, "Single-pass Parallel Prefix Scan with Decoupled Look-back", 2016). A tile
// then writes its entries straight to their payload positions, ascending, and moves those elements, so a
// limit is decided in the kernel; the last tile writes the header, and the count stays on the device
// until the caller next waits for the stream. (Selecting into per-tile slices, scanning the counts,
// copying the count to the host and gathering took four launches, an allocation and a blocking copy: 18%
// of the H200's memory bandwidth at 2^24 elements.)
#include <cuda/atomic>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <memory>
#include <vector>

#include "cuda_util.cuh"
#include "sparkgrad/compress.h"

namespace sparkgrad::compress::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kLoads = 4;                     // 16-byte loads per thread and tile
constexpr int kFieldBits = 16;                // per-load counts packed in one 64-bit scan value
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
constexpr std::int64_t kTile = std::int64_t{kBlock} * kLoads * kWidth<T>;  // 16 KiB: 4096 floats, 2048 doubles

// A tile's state word: epoch << 32 | kInclusive (set once the value includes every earlier tile) | value
// (the tile's count, or the count of it and all tiles before it; < 2^31 as n is). A word from another
// epoch is a previous launch's: not yet published.
constexpr std::uint64_t kInclusive = std::uint64_t{1} << 31;
constexpr std::uint64_t kValueMask = kInclusive - 1;
using StateRef = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>;

template <typename T>
struct EncodeArgs {
  T* x;                         // (n,)
  std::int64_t n;
  T t;                          // the float32 threshold as T
  bool aligned;                 // x is 16-byte aligned
  std::int64_t limit;           // entries of rank >= limit are neither written nor moved
  std::int32_t* message;        // (kHeaderWords + min(n, limit),)
  T* saved;                     // null, or (limit,): x's value before it moved, by entry rank
  std::int32_t threshold_word;  // header word 2
  std::int64_t tiles;           // ceil(n / kTile), at least 1 (n = 0: one tile writes the header)
  unsigned long long* ticket;   // 0 at launch; the kernel leaves it 0
  std::uint64_t* states;        // (tiles,) state words
  std::uint32_t epoch;          // this launch's tag, never 0
};

// Called by warp 0 of the block of tile `index` with its `count`: publishes the count, sums the counts of
// the tiles before it 32 at a time back to the nearest inclusive prefix, publishes its own inclusive
// prefix and returns the exclusive one. Every value travels inside its state word, so relaxed loads and
// stores suffice. No deadlock: a tile waits only for counts of tiles whose ids were handed out before its
// own, to running blocks; the earliest unpublished one is either its block's current tile (published
// after its loads, without waiting) or its next, whose block's current tile needs only published counts.
__device__ std::int64_t look_back(std::uint64_t* states, std::uint32_t epoch, std::int64_t index,
                                  std::int64_t count) {
  const int lane = static_cast<int>(threadIdx.x);
  const std::uint64_t tag = std::uint64_t{epoch} << 32;
  const auto value = static_cast<std::uint64_t>(count);
  if (index == 0) {
    if (lane == 0) StateRef(states[0]).store(tag | kInclusive | value, ::cuda::memory_order_relaxed);
    return 0;
  }
  if (lane == 0) StateRef(states[index]).store(tag | value, ::cuda::memory_order_relaxed);
  std::int64_t before = 0;
  for (std::int64_t end = index;; end -= 32) {
    const std::int64_t tile = end - 1 - lane;  // lane 0 reads the nearest tile
    std::uint64_t state = kInclusive;           // before tile 0: an inclusive prefix of 0
    if (tile >= 0) {
      StateRef ref(states[tile]);
      do {
        state = ref.load(::cuda::memory_order_relaxed);
      } while ((state >> 32) != epoch);
    }
    const unsigned inclusive = __ballot_sync(0xffffffffu, (state & kInclusive) != 0);
    const int nearest = inclusive != 0 ? __ffs(static_cast<int>(inclusive)) - 1 : 31;
    auto part = lane <= nearest ? static_cast<std::int64_t>(state & kValueMask) : std::int64_t{0};
    for (int offset = 16; offset > 0; offset /= 2) part += __shfl_xor_sync(0xffffffffu, part, offset);
    before += part;
    if (inclusive != 0) break;
  }
  if (lane == 0) {
    StateRef(states[index]).store(tag | kInclusive | static_cast<std::uint64_t>(before + count),
                                  ::cuda::memory_order_relaxed);
  }
  return before;
}

// The next tile id. Ids are handed out in the order blocks ask, so a tile waits only for tiles whose blocks
// are running. Every block asks once more than it has tiles, so the last of the launch's tiles + gridDim.x
// tickets leaves the counter at 0 for the next launch.
template <typename T>
__device__ std::int64_t take_ticket(const EncodeArgs<T>& a) {
  const unsigned long long ticket = atomicAdd(a.ticket, 1ull);
  if (ticket == static_cast<unsigned long long>(a.tiles) + gridDim.x - 1) atomicExch(a.ticket, 0ull);
  return static_cast<std::int64_t>(ticket);
}

// Tiles of kTile elements of x: (n,), taken one after another by each block (at most as many blocks as
// are resident), the next tile's id asked for while the current tile's loads are in flight. Load k of
// thread j covers the kWidth elements starting at tile + (k * kBlock + j) * kWidth: coalesced, and ascending
// in (k, j), so one exclusive scan of the per-load counts (packed in 16-bit fields) ranks every entry
// within the tile.
template <typename T>
__global__ void __launch_bounds__(kBlock) encode_tiles(const EncodeArgs<T> a) {
  constexpr int W = kWidth<T>;
  using U = typename FloatBits<T>::U;
  using Scan = cub::BlockScan<std::uint64_t, kBlock>;
  __shared__ typename Scan::TempStorage scan_storage;
  // by iteration parity, so that a value is not written again before the next iteration's barrier, which
  // every thread reaches only after reading it: the next tile's id, the entries before the current tile
  __shared__ std::int64_t shared_ticket[2];
  __shared__ std::int64_t shared_before[2];
  if (threadIdx.x == 0) shared_ticket[0] = take_ticket(a);
  __syncthreads();
  const U t_bits = to_bits(a.t);
  std::int64_t index = shared_ticket[0];
  for (int parity = 1; index < a.tiles; parity ^= 1) {
    const std::int64_t tile = index * kTile<T>;
    T v[kLoads][W];
    if (a.aligned && tile + kTile<T> <= a.n) {  // a full aligned tile: all loads in flight before any is used
      const auto* vectors = reinterpret_cast<const typename Vector<T>::type*>(a.x + tile) + threadIdx.x;
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
        for (int w = 0; w < W; ++w) v[k][w] = first + w < a.n ? a.x[first + w] : T(0);  // 0 never qualifies
      }
    }
    if (threadIdx.x == 0) shared_ticket[parity] = take_ticket(a);
    std::uint32_t mask = 0;  // bit k * W + w: element w of load k qualifies (|v| >= t, never NaN)
    std::uint64_t packed = 0;
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const U q = at_least(to_bits(v[k][w]) & ~FloatBits<T>::kSign, t_bits, FloatBits<T>::kInf);
        mask |= static_cast<std::uint32_t>(q) << (k * W + w);
        packed += static_cast<std::uint64_t>(q) << (kFieldBits * k);
      }
    }
    std::uint64_t before = 0;
    std::uint64_t totals = 0;
    Scan(scan_storage).ExclusiveSum(packed, before, totals);
    std::int64_t count = 0;
#pragma unroll
    for (int k = 0; k < kLoads; ++k) count += static_cast<std::int64_t>((totals >> (kFieldBits * k)) & kFieldMask);
    if (threadIdx.x < 32) {
      const std::int64_t prefix = look_back(a.states, a.epoch, index, count);
      if (threadIdx.x == 0) shared_before[parity] = prefix;
    }
    __syncthreads();  // also: scan_storage may be used again
    const std::int64_t tile_before = shared_before[parity];
    const std::int64_t next = shared_ticket[parity];
    if (mask != 0) {
      std::int64_t loads_before = 0;  // entries of the earlier loads of the tile, all threads
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        std::int64_t rank =
            tile_before + loads_before + static_cast<std::int64_t>((before >> (kFieldBits * k)) & kFieldMask);
        loads_before += static_cast<std::int64_t>((totals >> (kFieldBits * k)) & kFieldMask);
        const std::int64_t first = tile + (std::int64_t{k} * kBlock + threadIdx.x) * W;
#pragma unroll
        for (int w = 0; w < W; ++w) {
          if (((mask >> (k * W + w)) & 1u) == 0) continue;
          if (rank < a.limit) {
            T moved = v[k][w];
            a.message[kHeaderWords + rank] = sparse_entry(moved, a.t, first + w);
            if (a.saved != nullptr) a.saved[rank] = v[k][w];
            a.x[first + w] = moved;
          }
          ++rank;
        }
      }
    }
    if (index == a.tiles - 1 && threadIdx.x == 0) {
      const std::int64_t total = tile_before + count;
      a.message[0] = static_cast<std::int32_t>(total < a.limit ? total : a.limit);
      a.message[1] = static_cast<std::int32_t>(a.n);
      a.message[2] = a.threshold_word;
      a.message[3] = kFlagSparse;
    }
    index = next;
  }
}

// x[|e| - 1] = saved[k] for the entries e: (count,) of a payload encode_tiles wrote with saved values: puts
// back bit for bit what it moved (adding the threshold back would round).
template <typename T>
__global__ void restore_sent(T* x, const std::int32_t* entries, const T* saved, std::int64_t count) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (k >= count) return;
  const std::int32_t e = entries[k];
  x[(e < 0 ? -static_cast<std::int64_t>(e) : e) - 1] = saved[k];
}

// Per host thread and device: the look-back's ticket and tile states, reused by every launch (a launch
// tags its states with its epoch, so nothing is cleared between launches), and encode_smaller's buffers.
// An event recorded after each use orders the next one after it, on whatever stream either runs (a
// stream's handle may even be reused by a new stream while the old one's work is still queued).
class Workspace {
 public:
  explicit Workspace(const char* op) { check_cuda(op, cudaEventCreateWithFlags(&done_, cudaEventDisableTiming)); }
  ~Workspace() {  // at thread exit: nothing to report an error to
    cudaEventSynchronize(done_);
    cudaFree(states_);
    cudaFree(buffer_);
    if (host_ != nullptr) cudaFreeHost(host_);
    cudaEventDestroy(done_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Orders this use after the previous one, unless that has run already (the wait would cost the launch time).
  void begin(const char* op, cudaStream_t stream) {
    const cudaError_t state = cudaEventQuery(done_);
    if (state == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error, but the runtime may keep it for check_kernels to find
      check_cuda(op, cudaStreamWaitEvent(stream, done_, 0));
    } else {
      check_cuda(op, state);
    }
  }
  void end(const char* op, cudaStream_t stream) { check_cuda(op, cudaEventRecord(done_, stream)); }

  // Fills a's ticket, states (for `tiles` tiles) and epoch for a launch on `stream`.
  template <typename T>
  void prepare(const char* op, std::int64_t tiles, cudaStream_t stream, EncodeArgs<T>& a) {
    bool clear = epoch_ == UINT32_MAX;  // epochs are never reused without clearing the states
    if (tiles > state_tiles_) {
      const std::int64_t grown = std::max(tiles, 2 * state_tiles_);
      free_device(op, states_);
      state_tiles_ = 0;
      check_cuda(op, cudaMalloc(&states_, sizeof(std::uint64_t) * static_cast<std::size_t>(grown + 1)));
      state_tiles_ = grown;
      clear = true;
    }
    if (clear) {
      check_cuda(op, cudaMemsetAsync(states_, 0, sizeof(std::uint64_t) * static_cast<std::size_t>(state_tiles_ + 1),
                                     stream));
      epoch_ = 0;
    }
    a.ticket = reinterpret_cast<unsigned long long*>(states_);
    a.states = states_ + 1;
    a.epoch = ++epoch_;
  }

  // Device scratch of at least `bytes` (contents undefined).
  void* buffer(const char* op, std::size_t bytes) {
    if (bytes > buffer_bytes_) {
      free_device(op, buffer_);
      buffer_bytes_ = 0;
      check_cuda(op, cudaMalloc(&buffer_, bytes));
      buffer_bytes_ = bytes;
    }
    return buffer_;
  }

  // Pinned host memory of at least `bytes`; every use waits for its copies before the thread goes on.
  std::int32_t* host(const char* op, std::size_t bytes) {
    if (bytes > host_bytes_) {
      if (host_ != nullptr) check_cuda(op, cudaFreeHost(host_));
      host_ = nullptr;
      host_bytes_ = 0;
      check_cuda(op, cudaMallocHost(&host_, bytes));
      host_bytes_ = bytes;
    }
    return static_cast<std::int32_t*>(host_);
  }

  // Blocks of encode_tiles<T> the device holds at once: the grid, so that no block waits to start.
  template <typename T>
  std::int64_t resident_blocks(const char* op) {
    std::int64_t& blocks = resident_[sizeof(T) == sizeof(double)];
    if (blocks == 0) {
      int device = 0;
      int processors = 0;
      int per_processor = 0;
      check_cuda(op, cudaGetDevice(&device));
      check_cuda(op, cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device));
      check_cuda(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_processor, encode_tiles<T>, kBlock, 0));
      blocks = std::max<std::int64_t>(1, std::int64_t{processors} * per_processor);
    }
    return blocks;
  }

  // Words of this thread's last sparse message from encode_smaller: how much its first copy takes.
  std::int64_t last_sparse_words = 0;

 private:
  template <typename P>
  void free_device(const char* op, P*& p) {  // after the last use: cudaFree need not wait for the stream
    check_cuda(op, cudaEventSynchronize(done_));
    check_cuda(op, cudaFree(p));
    p = nullptr;
  }

  cudaEvent_t done_ = nullptr;
  std::uint64_t* states_ = nullptr;  // [0]: the ticket, then state_tiles_ state words
  std::int64_t state_tiles_ = 0;
  std::uint32_t epoch_ = 0;
  std::int64_t resident_[2] = {0, 0};  // float, double
  void* buffer_ = nullptr;
  std::size_t buffer_bytes_ = 0;
  void* host_ = nullptr;
  std::size_t host_bytes_ = 0;
};

Workspace& workspace(const char* op) {
  thread_local std::vector<std::unique_ptr<Workspace>> per_device;
  int device = 0;
  check_cuda(op, cudaGetDevice(&device));
  if (per_device.size() <= static_cast<std::size_t>(device)) per_device.resize(static_cast<std::size_t>(device) + 1);
  auto& slot = per_device[static_cast<std::size_t>(device)];
  if (!slot) slot = std::make_unique<Workspace>(op);
  return *slot;
}

// Queues encode_tiles on `stream` (between ws.begin and ws.end).
template <typename T>
void launch_encode(const char* op, Workspace& ws, cudaStream_t stream, T* x, std::int64_t n, double threshold,
                   std::int64_t limit, std::int32_t* message, T* saved) {
  const float tf = static_cast<float>(threshold);
  const std::int64_t tiles = n > 0 ? (n + kTile<T> - 1) / kTile<T> : 1;  // n = 0: one tile writes the header
  EncodeArgs<T> a{};
  a.x = x;
  a.n = n;
  a.t = static_cast<T>(tf);
  a.aligned = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  a.limit = limit;
  a.message = message;
  a.saved = saved;
  a.threshold_word = threshold_bits(tf);
  a.tiles = tiles;
  ws.prepare(op, tiles, stream, a);
  const auto grid = static_cast<unsigned>(std::min(tiles, ws.resident_blocks<T>(op)));
  encode_tiles<T><<<grid, kBlock, 0, stream>>>(a);
  check_kernels(op);
}

// Copies words [from, to) of the device message to host and waits for the stream.
void download(const char* op, Workspace& ws, cudaStream_t stream, std::int32_t* host, const std::int32_t* message,
              std::int64_t from, std::int64_t to) {
  const std::size_t bytes = sizeof(std::int32_t) * static_cast<std::size_t>(to - from);
  check_cuda(op, cudaMemcpyAsync(host + from, message + from, bytes, cudaMemcpyDeviceToHost, stream));
  ws.end(op, stream);
  check_cuda(op, cudaStreamSynchronize(stream));
}

// The first copy of encode_smaller takes at least this many words (16 KiB), so that a message somewhat longer
// than the last one usually arrives in the same copy.
constexpr std::int64_t kFirstCopyWords = 4096;

}  // namespace

template <typename T>
void threshold_encode(T* x, std::int64_t n, double threshold, std::int64_t limit, std::int32_t* message) {
  const char* op = "threshold_encode";
  const cudaStream_t stream = gpu::current_stream();
  Workspace& ws = workspace(op);
  ws.begin(op, stream);
  launch_encode<T>(op, ws, stream, x, n, threshold, std::min(n, limit), message, nullptr);
  ws.end(op, stream);
}

std::int64_t message_entries(const std::int32_t* message) {
  const char* op = "threshold_encode";
  const cudaStream_t stream = gpu::current_stream();
  Workspace& ws = workspace(op);
  std::int32_t* host = ws.host(op, sizeof(std::int32_t));
  check_cuda(op, cudaMemcpyAsync(host, message, sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  check_cuda(op, cudaStreamSynchronize(stream));
  return *host;
}

template <typename T>
HostMessage encode_smaller(T* x, std::int64_t n, double threshold) {
  const char* op = "threshold_encode";
  const cudaStream_t stream = gpu::current_stream();
  Workspace& ws = workspace(op);
  // The pass stops one entry past the longest sparse message that is still smaller than the bitmap: an
  // encode that reaches it has shown the bitmap to be smaller, and its saved values undo it exactly.
  const std::int64_t bitmap_payload = bitmap_length(n) - kHeaderWords;
  const std::int64_t limit = std::min(n, bitmap_payload + 1);
  const std::int64_t words = std::max(kHeaderWords + limit, bitmap_length(n));
  const std::size_t saved_at = (sizeof(std::int32_t) * static_cast<std::size_t>(words) + 15) / 16 * 16;
  ws.begin(op, stream);
  auto* buffer = static_cast<char*>(ws.buffer(op, saved_at + sizeof(T) * static_cast<std::size_t>(limit)));
  auto* message = reinterpret_cast<std::int32_t*>(buffer);
  auto* saved = reinterpret_cast<T*>(buffer + saved_at);
  std::int32_t* host = ws.host(op, sizeof(std::int32_t) * static_cast<std::size_t>(words));
  launch_encode<T>(op, ws, stream, x, n, threshold, limit, message, saved);
  const std::int64_t first =
      std::min(kHeaderWords + limit, std::max(kFirstCopyWords, ws.last_sparse_words + ws.last_sparse_words / 4));
  download(op, ws, stream, host, message, 0, first);
  const std::int64_t entries = host[0];
  if (sparse_is_smaller(entries, n)) {
    const std::int64_t length = kHeaderWords + entries;
    if (length > first) download(op, ws, stream, host, message, first, length);
    ws.last_sparse_words = length;
    return {host, length, false};
  }
  restore_sent<<<grid_for(entries, kBlock), kBlock, 0, stream>>>(x, message + kHeaderWords, saved, entries);
  check_kernels(op);
  bitmap_encode(x, n, threshold, message);
  download(op, ws, stream, host, message, 0, bitmap_length(n));
  return {host, bitmap_length(n), true};
}

template void threshold_encode<float>(float*, std::int64_t, double, std::int64_t, std::int32_t*);
template void threshold_encode<double>(double*, std::int64_t, double, std::int64_t, std::int32_t*);
template HostMessage encode_smaller<float>(float*, std::int64_t, double);
template HostMessage encode_smaller<double>(double*, std::int64_t, double);

}  // namespace sparkgrad::compress::cuda
