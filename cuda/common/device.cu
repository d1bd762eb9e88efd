// CUDA build: a GPU counts as available when the runtime reports at least one device; the calling
// thread's stream and GEMM precision per device, and the debug switch that waits after every op.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "../compress/cuda_util.cuh"
#include "sparkgrad/common.h"

namespace sparkgrad {

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return false;
  }
  return count > 0;
}

namespace gpu {

bool built() { return true; }

namespace {

std::atomic<bool> sync_flag{[] {
  const char* env = std::getenv("SPARKGRAD_CUDA_SYNC");
  return env != nullptr && std::strcmp(env, "1") == 0;
}()};

// The calling thread's stream for each device ordinal (absent: the legacy default stream).
thread_local std::vector<cudaStream_t> thread_streams;
// The calling thread's GEMM precision for each device ordinal (absent: Float32).
thread_local std::vector<Precision> thread_precisions;

// Scratch buffers come from the device's stream-ordered pool (cudaMallocAsync). By default the pool
// returns its memory to the driver at every synchronization, and the next step pays cudaMalloc again;
// keeping it makes a step's scratch allocations free after the first step, as CuPy's pool does.
void keep_pool_memory(int device) {
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.size() <= static_cast<std::size_t>(device)) done.resize(static_cast<std::size_t>(device) + 1);
  if (done[static_cast<std::size_t>(device)]) return;
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    std::uint64_t keep = UINT64_MAX;
    compress::cuda::check_cuda("set_stream", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  } else {
    cudaGetLastError();  // a device without the stream-ordered allocator: cudaMallocAsync reports it per op
  }
  done[static_cast<std::size_t>(device)] = true;
}

int current_device(const char* op) {
  int device = 0;
  compress::cuda::check_cuda(op, cudaGetDevice(&device));
  return device;
}

}  // namespace

void set_stream(std::uintptr_t stream) {
  const int device = current_device("set_stream");
  if (thread_streams.size() <= static_cast<std::size_t>(device)) {
    thread_streams.resize(static_cast<std::size_t>(device) + 1, nullptr);
    keep_pool_memory(device);
  }
  thread_streams[static_cast<std::size_t>(device)] = reinterpret_cast<cudaStream_t>(stream);
}

cudaStream_t current_stream() {
  const int device = current_device("current_stream");
  return static_cast<std::size_t>(device) < thread_streams.size() ? thread_streams[static_cast<std::size_t>(device)]
                                                                  : nullptr;
}

void set_precision(Precision precision) {
  const auto device = static_cast<std::size_t>(current_device("set_precision"));
  if (thread_precisions.size() <= device) thread_precisions.resize(device + 1, Precision::Float32);
  thread_precisions[device] = precision;
}

Precision current_precision() {
  const auto device = static_cast<std::size_t>(current_device("current_precision"));
  return device < thread_precisions.size() ? thread_precisions[device] : Precision::Float32;
}

void set_sync_each_op(bool on) { sync_flag.store(on); }
bool sync_each_op() { return sync_flag.load(); }

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {  // no driver or no GPU: nothing visible
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    const cudaError_t status = cudaGetDeviceProperties(&prop, i);
    if (status != cudaSuccess) throw_runtime("cuda_devices", "device ", i, ": ", cudaGetErrorString(status));
    out.push_back({i, prop.name, prop.major, prop.minor, static_cast<std::uint64_t>(prop.totalGlobalMem)});
  }
  return out;
}

}  // namespace gpu

}  // namespace sparkgrad
