// Small CUDA helpers of every CUDA twin: error checks that throw "[op] ...", copies and fills on the
// calling thread's stream, and an owning scratch buffer, so every early exit frees what it allocated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sparkgrad/common.h"

namespace sparkgrad::gpu {
// The calling thread's stream on the current device (cuda/common/device.cu; see gpu::set_stream).
cudaStream_t current_stream();
}  // namespace sparkgrad::gpu

namespace sparkgrad::compress::cuda {

inline void check_cuda(const char* op, cudaError_t status) {
  if (status != cudaSuccess) throw_runtime(op, "CUDA error: ", cudaGetErrorString(status));
}

// Checks the launch; the kernels run on asynchronously unless the debug switch gpu::sync_each_op() is
// on, which waits for them so an asynchronous fault surfaces at the op that caused it.
inline void check_kernels(const char* op) {
  check_cuda(op, cudaGetLastError());
  if (gpu::sync_each_op()) check_cuda(op, cudaDeviceSynchronize());
}

// Copies `bytes` from the device to the host on the current stream and waits: for the values the host
// needs (counts, headers, flags).
inline void copy_to_host(const char* op, void* host, const void* device, std::size_t bytes) {
  const cudaStream_t stream = gpu::current_stream();
  check_cuda(op, cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
  check_cuda(op, cudaStreamSynchronize(stream));
}

// Copies `bytes` of pageable host memory to the device on the current stream; the host memory may be
// reused on return (the driver stages pageable memory before the call returns).
inline void copy_to_device(const char* op, void* device, const void* host, std::size_t bytes) {
  check_cuda(op, cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, gpu::current_stream()));
}

inline void fill_zero(const char* op, void* device, std::size_t bytes) {
  check_cuda(op, cudaMemsetAsync(device, 0, bytes, gpu::current_stream()));
}

// Scratch memory from the device's stream-ordered pool, freed in stream order: the kernels queued with it
// may still run after the owner is destroyed.
template <typename U>
class DeviceBuffer {
 public:
  DeviceBuffer(const char* op, std::int64_t count) : stream_(gpu::current_stream()) {
    check_cuda(op, cudaMallocAsync(reinterpret_cast<void**>(&ptr_),
                                   sizeof(U) * static_cast<std::size_t>(count > 0 ? count : 1), stream_));
  }
  ~DeviceBuffer() { cudaFreeAsync(ptr_, stream_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  U* get() const { return ptr_; }

 private:
  U* ptr_ = nullptr;
  cudaStream_t stream_;
};

// Grid size for one thread per item with `block` threads per block.
inline unsigned grid_for(std::int64_t items, int block) {
  return static_cast<unsigned>((items + block - 1) / block);
}

}  // namespace sparkgrad::compress::cuda
