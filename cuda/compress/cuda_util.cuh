// Small CUDA helpers for the compress kernels: error checks that throw "[op] ..." and an owning device
// buffer, so every early exit frees what it allocated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sparkgrad/common.h"

namespace sparkgrad::compress::cuda {

inline void check_cuda(const char* op, cudaError_t status) {
  if (status != cudaSuccess) throw_runtime(op, "CUDA error: ", cudaGetErrorString(status));
}

// Checks the launch and waits for the kernels, so asynchronous faults surface at the op that caused them.
inline void check_kernels(const char* op) {
  check_cuda(op, cudaGetLastError());
  check_cuda(op, cudaDeviceSynchronize());
}

template <typename U>
class DeviceBuffer {
 public:
  DeviceBuffer(const char* op, std::int64_t count) {
    check_cuda(op, cudaMalloc(&ptr_, sizeof(U) * static_cast<std::size_t>(count > 0 ? count : 1)));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  U* get() const { return ptr_; }

 private:
  U* ptr_ = nullptr;
};

// Grid size for one thread per item with `block` threads per block.
inline unsigned grid_for(std::int64_t items, int block) {
  return static_cast<unsigned>((items + block - 1) / block);
}

}  // namespace sparkgrad::compress::cuda
