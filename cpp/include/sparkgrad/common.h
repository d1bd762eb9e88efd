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

// Many products a @ op(b) with one fixed b and a short m: a recurrent layer's weights against each time
// step's state. On OpenBLAS cores with small-matrix kernels, op(b) is laid out once as contiguous column
// panels whose products stay under those kernels' bound, cutting k into chunks when even a panel one SIMD
// register wide would not, so no step pays OpenBLAS's packing (on the development machine: 64x256 @
// 256x1024 at 80 GFLOP/s in one call, 110 in panels of 32; 64x1024 @ 1024x256 at 71 GFLOP/s in the NT
// form, 95 in the NN form, 109 in panels of 16 with k in two chunks); the panels of a product are shared
// among the OpenMP threads. Elsewhere a product is one gemm on op(b) stored untransposed. Each element of
// c comes from the same calls in the same order whatever the thread count.
template <typename T>
class FixedOperandGemm {
 public:
  // op(b): (k, n), stored with row stride ldb; m: the rows of every a multiplied.
  FixedOperandGemm(Transpose trans_b, std::int64_t m, std::int64_t k, std::int64_t n, const T* b,
                   std::int64_t ldb);
  // op(b) = [b1; b2] stacked, untransposed: b1 (k1, n) with row stride ldb1 over b2 (k2, n) with ldb2 (a
  // recurrent layer's input and recurrent weights against [x_t | h_{t-1}]).
  FixedOperandGemm(std::int64_t m, std::int64_t k1, std::int64_t k2, std::int64_t n, const T* b1,
                   std::int64_t ldb1, const T* b2, std::int64_t ldb2);
  // c (m, n) = a (m, k) @ op(b) + beta * c; a and c have row strides lda and ldc.
  void multiply(const T* a, std::int64_t lda, T beta, T* c, std::int64_t ldc) const;

 private:
  void layout(Transpose trans_b, const T* b1, std::int64_t ldb1, std::int64_t k1, const T* b2, std::int64_t ldb2);

  std::int64_t m_, k_, n_;
  std::int64_t panel_;  // column panel width (n_: one panel)
  std::int64_t chunk_;  // rows of op(b) per call (k_: all of them)
  std::vector<T> panels_;  // op(b)[:, j:j+w] for each panel, (k, w) row-major, one after another
};

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

// Compute precision of the calling thread's float32 GEMMs, per device like the stream: Float32, or
// tensor-core products whose operands lose at most what bfloat16 / float16 loses (TF32, or operands
// rounded to 16 bits: cuda/common/blas.cu) with float32 accumulation and output, so every buffer stays
// float32 (mixed precision, set by a network around its passes). Float64 GEMMs ignore it. Float32 until
// set; the CPU build keeps one value per thread, which its kernels ignore.
enum class Precision : std::uint8_t { Float32, Bf16, Fp16 };
void set_precision(Precision precision);
Precision current_precision();

// The row-major gemm above through cuBLAS (cuda/common/blas.cu): a, b, c are device pointers.
template <typename T>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);
// `batch` such products in one cuBLAS call: the i-th multiplies a + i * stride_a by b + i * stride_b into
// c + i * stride_c (strides in elements), in the calling thread's precision as gemm.
template <typename T>
void gemm_strided_batched(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                          T alpha, const T* a, std::int64_t lda, std::int64_t stride_a, const T* b, std::int64_t ldb,
                          std::int64_t stride_b, T beta, T* c, std::int64_t ldc, std::int64_t stride_c,
                          std::int64_t batch);
}  // namespace sparkgrad::gpu
