// Compiled when SPARKGRAD_ENABLE_CUDA is OFF: the CUDA entry points exist but report that CUDA is absent.
#include "sparkgrad/common.h"

namespace sparkgrad {

bool cuda_available() { return false; }

}  // namespace sparkgrad
