// Shared plumbing for every native kernel: error conventions, OpenMP helpers, BLAS GEMM.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace sparkgrad {

// Builds "[op] message" from any streamable parts: the prefix convention of every native error.
template <typename... Parts>
std::string op_message(const char* op, const Parts&... parts) {
  std::ostringstream out;
  out << '[' << op << "] ";
  (out << ... << parts);
  return out.str();
}

// Caller mistakes (become ValueError in Python).
template <typename... Parts>
[[noreturn]] void throw_invalid(const char* op, const Parts&... parts) {
  throw std::invalid_argument(op_message(op, parts...));
}

// Environment/runtime failures (become RuntimeError in Python).
template <typename... Parts>
[[noreturn]] void throw_runtime(const char* op, const Parts&... parts) {
  throw std::runtime_error(op_message(op, parts...));
}

// Exceptions must never escape an OpenMP region: each iteration runs under capture(), the first
// exception is kept, and rethrow() raises it after the parallel loop has finished.
class OmpExceptionGuard {
 public:
  template <typename Fn>
  void capture(Fn&& fn) noexcept {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

// Number of OpenMP threads a parallel region would use now.
int max_threads();
// Sets the OpenMP thread count for this process (n >= 1).
void set_num_threads(int n);
// "OpenBLAS 0.3.x ..." as reported by the library, for `sparkgrad info`.
std::string blas_info();

enum class Transpose : std::uint8_t { No, Yes };

// Row-major GEMM through OpenBLAS: c = alpha * op(a) @ op(b) + beta * c.
// op(a): (m, k), op(b): (k, n), c: (m, n); lda/ldb/ldc are the row strides (in elements) of the
// stored a, b, c.
template <typename T>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);

// The same product for a GEMM with short m and k and a long n (a convolution's channels against its
// columns), which OpenBLAS runs faster as several calls: on the cores it has small-matrix kernels for
// (SkylakeX and later), products of at most 1e6 multiply-adds are computed straight from the operands,
// larger ones are first packed into blocks. n is cut into equal pieces under that size (16x144x784 ran
// at 81 GFLOP/s in one call, 106 in two pieces, on the development machine); elsewhere, or when the
// pieces would be narrower than 48 columns, this is one gemm call. Each element of c still comes from
// one call over the whole of k.
template <typename T>
void gemm_in_small_pieces(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                          std::int64_t ldc);

}  // namespace sparkgrad

namespace sparkgrad {
// True when this build has CUDA kernels and at least one GPU is visible (cuda/no_cuda.cpp: false).
bool cuda_available();
}  // namespace sparkgrad

// The common area's CUDA side (named gpu, not cuda: code with using-directives for sparkgrad and an area
// would otherwise find two namespaces named cuda).
namespace sparkgrad::gpu {
// True in a CUDA build (cuda/common/device.cu), false in the CPU build (cuda/no_cuda.cpp).
bool built();

struct DeviceInfo {
  int index;
  std::string name;
  int major, minor;  // compute capability
  std::uint64_t total_memory;  // bytes
};
// The GPUs the CUDA runtime sees (empty without a driver or GPU; throws in the CPU build).
std::vector<DeviceInfo> devices();

// The stream the calling thread's CUDA ops run on, per device: sparkgrad.cuda passes CuPy's current
// stream before each op (a raw cudaStream_t; 0, the legacy default stream, until then). Ops on one stream
// run in order, so an op returns once its work is queued; the host waits only where it reads a value.
// No-op in the CPU build.
void set_stream(std::uintptr_t stream);
// Debug switch (initially SPARKGRAD_CUDA_SYNC=1 in the environment): every op waits for the device before
// it returns, so an asynchronous fault surfaces at the op that caused it.
void set_sync_each_op(bool on);
bool sync_each_op();

// The row-major gemm above through cuBLAS (cuda/common/blas.cu): a, b, c are device pointers.
template <typename T>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);
}  // namespace sparkgrad::gpu
