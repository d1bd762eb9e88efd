// Compiled when SPARKGRAD_ENABLE_CUDA is OFF: the CUDA entry points exist but report that CUDA is absent.
#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

namespace sparkgrad {

bool cuda_available() { return false; }

}  // namespace sparkgrad

namespace sparkgrad::compress::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) { throw_runtime(op, "sparkgrad was built without CUDA"); }
}  // namespace

template <typename T>
std::int64_t threshold_count(const T*, std::int64_t, double) { no_cuda("threshold_encode"); }
template <typename T>
void threshold_encode(T*, std::int64_t, double, std::int64_t, std::int32_t*) { no_cuda("threshold_encode"); }
template <typename T>
std::int64_t bitmap_encode(T*, std::int64_t, double, std::int32_t*) { no_cuda("bitmap_encode"); }
template <typename T>
void decode(const char* op, const std::int32_t*, std::int64_t, T*, std::int64_t, std::int32_t) { no_cuda(op); }
template <typename T>
void accumulate(T*, const T*, std::int64_t) { no_cuda("accumulate"); }
template <typename T>
void clip(T*, std::int64_t, T) { no_cuda("clip"); }

#define SPARKGRAD_NO_CUDA_COMPRESS(T)                                                   \
  template std::int64_t threshold_count<T>(const T*, std::int64_t, double);             \
  template void threshold_encode<T>(T*, std::int64_t, double, std::int64_t, std::int32_t*); \
  template std::int64_t bitmap_encode<T>(T*, std::int64_t, double, std::int32_t*);      \
  template void decode<T>(const char*, const std::int32_t*, std::int64_t, T*, std::int64_t, std::int32_t); \
  template void accumulate<T>(T*, const T*, std::int64_t);                              \
  template void clip<T>(T*, std::int64_t, T);
SPARKGRAD_NO_CUDA_COMPRESS(float)
SPARKGRAD_NO_CUDA_COMPRESS(double)
#undef SPARKGRAD_NO_CUDA_COMPRESS

}  // namespace sparkgrad::compress::cuda
