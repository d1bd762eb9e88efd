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

}  // namespace sparkgrad
