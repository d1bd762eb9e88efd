// CUDA build: a GPU counts as available when the runtime reports at least one device.
#include <cuda_runtime.h>

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
