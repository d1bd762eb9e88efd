// Convolutions through cuDNN (its convolution API: cudnnConvolutionForward / BackwardData / BackwardFilter).
// One handle per host thread and device, bound to the calling thread's stream (as blas.cu does for
// cuBLAS). Each shape gets a plan once: its descriptors and, per pass, the algorithm cudnnFind*Ex measured
// fastest on the first call's own buffers among the deterministic ones (results reproducible run to run,
// as the own kernels are) that fit the search's workspace. Every call then takes that algorithm's workspace
// from the device's stream-ordered pool. Float32 runs on the FMA units (CUDNN_FMA_MATH): no TF32 rounding
// of the operands, as the own kernels and PyTorch with TF32 off. Under mixed precision (the calling
// thread's gpu::current_precision(), set by a bf16 or fp16 network) a float32 convolution narrows its two
// inputs to bfloat16 / float16, runs on the tensor cores with float32 accumulation, and widens the result
// back: every buffer the network keeps stays float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "conv2d_cudnn.cuh"
#include "kernel_util.cuh"
#include "sparkgrad/common.h"

namespace sparkgrad::nn::cuda::cudnn {

namespace {
using namespace sparkgrad::detail::cuda;

void check(const char* op, cudnnStatus_t status) {
  if (status != CUDNN_STATUS_SUCCESS) throw_runtime(op, "cuDNN error: ", cudnnGetErrorString(status));
}

// The calling thread's handle for the current device, on the calling thread's stream.
cudnnHandle_t handle(const char* op) {
  struct Destroy {
    void operator()(cudnnContext* h) const { cudnnDestroy(h); }
  };
  thread_local std::vector<std::unique_ptr<cudnnContext, Destroy>> owned;  // indexed by device ordinal
  int device = 0;
  check_cuda(op, cudaGetDevice(&device));
  if (owned.size() <= static_cast<std::size_t>(device)) owned.resize(static_cast<std::size_t>(device) + 1);
  auto& slot = owned[static_cast<std::size_t>(device)];
  if (!slot) {
    cudnnHandle_t h = nullptr;
    check(op, cudnnCreate(&h));
    slot.reset(h);
  }
  const cudaStream_t stream = gpu::current_stream();
  cudaStream_t bound = nullptr;
  check(op, cudnnGetStream(slot.get(), &bound));
  if (bound != stream) check(op, cudnnSetStream(slot.get(), stream));
  return slot.get();
}

enum class Pass : int { Forward = 0, BackwardInput = 1, BackwardWeight = 2 };

struct Choice {
  int algorithm;
  std::size_t workspace;  // bytes
};

// The descriptors of one shape and dtype (read-only once made, so threads share them) and the algorithm
// chosen for each pass, found on its first call.
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;  // (n, c, h, w), (n, k, p, q); also dx and dy
  cudnnFilterDescriptor_t w = nullptr;               // (k, c, r, s); also dw
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::array<std::optional<Choice>, 3> chosen;  // by Pass
  std::array<bool, 3> unusable{};               // by Pass: cuDNN refused the shape in this element type
};

using Key = std::array<std::int64_t, 16>;  // device, element type, the 13 numbers of Conv2dShape, precision

// The element type the convolution runs in: T itself, or the 16-bit type mixed precision narrows to.
template <typename T>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDNN_DATA_BFLOAT16;
  if constexpr (std::is_same_v<T, __half>) return CUDNN_DATA_HALF;
  return CUDNN_DATA_FLOAT;
}

// E: the element type (float, double, __nv_bfloat16, __half). 16-bit convolutions accumulate in float32
// (cuDNN's PSEUDO_BFLOAT16 / PSEUDO_HALF configurations) on the tensor cores.
template <typename E>
Plan make_plan(const char* op, const Conv2dShape& g) {
  constexpr bool narrow = sizeof(E) == 2;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };  // unsupported() checked the range
  Plan plan;
  plan.math = narrow ? CUDNN_TENSOR_OP_MATH : std::is_same_v<E, float> ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  const cudnnDataType_t type = data_type<E>(), compute = narrow ? CUDNN_DATA_FLOAT : type;
  check(op, cudnnCreateTensorDescriptor(&plan.x));
  check(op, cudnnCreateTensorDescriptor(&plan.y));
  check(op, cudnnCreateFilterDescriptor(&plan.w));
  check(op, cudnnCreateConvolutionDescriptor(&plan.conv));
  check(op, cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, type, i(g.n), i(g.c), i(g.h), i(g.w)));
  check(op, cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, type, i(g.n), i(g.k), i(g.p), i(g.q)));
  check(op, cudnnSetFilter4dDescriptor(plan.w, type, CUDNN_TENSOR_NCHW, i(g.k), i(g.c), i(g.r), i(g.s)));
  check(op, cudnnSetConvolution2dDescriptor(plan.conv, i(g.pad_top), i(g.pad_left), i(g.stride_h), i(g.stride_w), 1,
                                            1, CUDNN_CROSS_CORRELATION, compute));
  check(op, cudnnSetConvolutionMathType(plan.conv, plan.math));
  std::array<int, 4> out{};
  check(op, cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &out[0], &out[1], &out[2], &out[3]));
  if (out != std::array<int, 4>{i(g.n), i(g.k), i(g.p), i(g.q)}) {
    throw_runtime(op, "cuDNN computes a (", out[0], ", ", out[1], ", ", out[2], ", ", out[3], ") output, not (", g.n,
                  ", ", g.k, ", ", g.p, ", ", g.q, ")");
  }
  return plan;
}

// Plans live as long as the process (one per shape a program uses), so they are never destroyed: no
// cuDNN call runs from a static destructor after the library may have gone.
std::mutex plans_mutex;
std::map<Key, Plan>& plans() {
  static auto* all = new std::map<Key, Plan>();
  return *all;
}

// The cuDNN calls of each pass, with its three arrays named as the pass names them: a and b in, out written.
template <Pass P>
struct Api;

// Elements of x: (n, c, h, w), w: (k, c, r, s) and y: (n, k, p, q).
std::int64_t x_size(const Conv2dShape& g) { return g.n * g.c * g.h * g.w; }
std::int64_t w_size(const Conv2dShape& g) { return g.k * g.c * g.r * g.s; }
std::int64_t y_size(const Conv2dShape& g) { return g.n * g.k * g.p * g.q; }

template <>
struct Api<Pass::Forward> {  // a = x, b = w, out = y
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static std::array<std::int64_t, 3> sizes(const Conv2dShape& g) { return {x_size(g), w_size(g), y_size(g)}; }
  static bool transform_based(int algo) {
    return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
  }
  static constexpr int kAlgorithms = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, int algo, std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                                   bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Plan& p, const void* a, const void* b, void* out, int* found,
                            Perf* perf, void* ws, std::size_t bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, p.x, a, p.w, b, p.conv, p.y, out, kAlgorithms, found, perf, ws,
                                                  bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Plan& p, int algo, const void* one, const void* a, const void* b,
                           void* ws, std::size_t bytes, const void* zero, void* out) {
    return cudnnConvolutionForward(h, one, p.x, a, p.w, b, p.conv, static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws,
                                   bytes, zero, p.y, out);
  }
};

template <>
struct Api<Pass::BackwardInput> {  // a = dy, b = w, out = dx
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static std::array<std::int64_t, 3> sizes(const Conv2dShape& g) { return {y_size(g), w_size(g), x_size(g)}; }
  static bool transform_based(int algo) {
    return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
  }
  static constexpr int kAlgorithms = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, int algo, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x,
                                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Plan& p, const void* a, const void* b, void* out, int* found,
                            Perf* perf, void* ws, std::size_t bytes) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w, b, p.y, a, p.conv, p.x, out, kAlgorithms, found, perf,
                                                       ws, bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Plan& p, int algo, const void* one, const void* a, const void* b,
                           void* ws, std::size_t bytes, const void* zero, void* out) {
    return cudnnConvolutionBackwardData(h, one, p.w, b, p.y, a, p.conv, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
                                        ws, bytes, zero, p.x, out);
  }
};

template <>
struct Api<Pass::BackwardWeight> {  // a = x, b = dy, out = dw
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static std::array<std::int64_t, 3> sizes(const Conv2dShape& g) { return {x_size(g), y_size(g), w_size(g)}; }
  static bool transform_based(int algo) {
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
           algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
  static constexpr int kAlgorithms = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, int algo, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w,
                                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Plan& p, const void* a, const void* b, void* out, int* found,
                            Perf* perf, void* ws, std::size_t bytes) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x, a, p.y, b, p.conv, p.w, out, kAlgorithms, found, perf,
                                                         ws, bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Plan& p, int algo, const void* one, const void* a, const void* b,
                           void* ws, std::size_t bytes, const void* zero, void* out) {
    return cudnnConvolutionBackwardFilter(h, one, p.x, a, p.y, b, p.conv,
                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, bytes, zero, p.w, out);
  }
};

// The most workspace the search may take: 1 GiB, or half the free device memory when less is free.
std::size_t search_workspace_limit(const char* op) {
  std::size_t free_bytes = 0, total_bytes = 0;
  check_cuda(op, cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::min<std::size_t>(std::size_t{1} << 30, free_bytes / 2);
}

// Times the pass's algorithms on the call's own arrays (out is overwritten, as the call does anyway) and
// returns the fastest deterministic one that keeps the plan's math, or nothing when none can run. Under
// CUDNN_FMA_MATH (float32) that excludes tensor-core conversion and the FFT and non-fused Winograd
// algorithms: on an H200 one of them computed a float32 5x5 convolution 2% off (0.05 on outputs of about
// 2, fifty times the error of any sum of its products), where the GEMM-like ones keep the own kernels'
// error bound.
template <Pass P>
std::optional<Choice> find(const char* op, cudnnHandle_t h, const Plan& plan, const void* a, const void* b,
                           void* out) {
  const std::size_t limit = search_workspace_limit(op);
  std::size_t most = 0;
  for (int algo = 0; algo < Api<P>::kAlgorithms; ++algo) {
    std::size_t bytes = 0;  // algorithms that cannot run this shape answer NOT_SUPPORTED: skipped
    if (Api<P>::workspace(h, plan, algo, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= limit) most = std::max(most, bytes);
  }
  DeviceBuffer<unsigned char> workspace(op, static_cast<std::int64_t>(most));
  typename Api<P>::Perf perf[Api<P>::kAlgorithms];
  int found = 0;
  // a configuration cuDNN does not take (seen: BAD_PARAM for some bfloat16 shapes) is no algorithm
  if (Api<P>::find(h, plan, a, b, out, &found, perf, workspace.get(), most) != CUDNN_STATUS_SUCCESS) return {};
  for (int i = 0; i < found; ++i) {  // fastest first
    const auto& r = perf[i];
    const bool exact = plan.math != CUDNN_FMA_MATH ||
                       (r.mathType != CUDNN_TENSOR_OP_MATH && r.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
                        !Api<P>::transform_based(static_cast<int>(r.algo)));
    if (r.status == CUDNN_STATUS_SUCCESS && r.determinism == CUDNN_DETERMINISTIC && r.memory <= most && exact) {
      return Choice{static_cast<int>(r.algo), r.memory};
    }
  }
  return {};
}

// Runs pass P with elements E on device arrays a, b -> out, finding its algorithm on the first call; false
// (nothing run) when cuDNN has no algorithm for it.
template <Pass P, typename E>
bool run_in(const char* op, const Conv2dShape& g, gpu::Precision precision, const E* a, const E* b, E* out) {
  cudnnHandle_t h = handle(op);
  int device = 0;
  check_cuda(op, cudaGetDevice(&device));
  const Key key{device, static_cast<std::int64_t>(data_type<E>()), g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.p, g.q,
                g.stride_h, g.stride_w, g.pad_top, g.pad_left, static_cast<std::int64_t>(precision)};
  const Plan* plan = nullptr;
  Choice choice{};
  {
    // the search runs under the lock: once per shape and pass, and a second thread asking for the same
    // plan waits for its result instead of timing the algorithms again
    std::lock_guard<std::mutex> lock(plans_mutex);
    auto it = plans().find(key);
    if (it == plans().end()) it = plans().emplace(key, make_plan<E>(op, g)).first;
    Plan& p = it->second;
    auto& slot = p.chosen[static_cast<int>(P)];
    bool& unusable = p.unusable[static_cast<int>(P)];
    if (!slot && !unusable) {
      slot = find<P>(op, h, p, a, b, out);
      unusable = !slot;
    }
    if (unusable) return false;
    plan = &p;
    choice = *slot;
  }
  DeviceBuffer<unsigned char> workspace(op, static_cast<std::int64_t>(choice.workspace));
  // cuDNN's scaling factors are double for double data and float for every other type
  using Scale = std::conditional_t<std::is_same_v<E, double>, double, float>;
  const Scale one = 1, zero = 0;
  check(op, Api<P>::run(h, *plan, choice.algorithm, &one, a, b, workspace.get(), choice.workspace, &zero, out));
  check_kernels(op);
  return true;
}

template <typename H>
__global__ void narrow_kernel(const float* in, H* out, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    if constexpr (std::is_same_v<H, __half>) {
      out[i] = __float2half_rn(in[i]);  // beyond 65504: inf, which the fp16 loss scaler detects
    } else {
      out[i] = __float2bfloat16_rn(in[i]);
    }
  }
}

template <typename H>
__global__ void widen_kernel(const H* in, float* out, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    if constexpr (std::is_same_v<H, __half>) {
      out[i] = __half2float(in[i]);
    } else {
      out[i] = __bfloat162float(in[i]);
    }
  }
}

// Pass P of float32 arrays in 16-bit H: a and b narrowed into scratch, out widened from it.
template <Pass P, typename H>
bool run_narrowed(const char* op, const Conv2dShape& g, gpu::Precision precision, const float* a, const float* b,
                  float* out) {
  const auto [a_size, b_size, out_size] = Api<P>::sizes(g);
  DeviceBuffer<H> a16(op, a_size), b16(op, b_size), out16(op, out_size);
  const cudaStream_t stream = gpu::current_stream();
  narrow_kernel<H><<<blocks_for(a_size), kThreads, 0, stream>>>(a, a16.get(), a_size);
  narrow_kernel<H><<<blocks_for(b_size), kThreads, 0, stream>>>(b, b16.get(), b_size);
  check_cuda(op, cudaGetLastError());
  if (!run_in<P, H>(op, g, precision, a16.get(), b16.get(), out16.get())) return false;
  widen_kernel<H><<<blocks_for(out_size), kThreads, 0, stream>>>(out16.get(), out, out_size);
  check_kernels(op);
  return true;
}

template <Pass P, typename T>
bool run_pass(const char* op, const Conv2dShape& g, const T* a, const T* b, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    const gpu::Precision precision = gpu::current_precision();
    if (precision == gpu::Precision::Bf16) return run_narrowed<P, __nv_bfloat16>(op, g, precision, a, b, out);
    if (precision == gpu::Precision::Fp16) return run_narrowed<P, __half>(op, g, precision, a, b, out);
  }
  return run_in<P, T>(op, g, gpu::Precision::Float32, a, b, out);
}

}  // namespace

std::string unsupported(const Conv2dShape& g) {
  std::ostringstream why;
  const auto symmetric = [](std::int64_t in, std::int64_t pad, std::int64_t kernel, std::int64_t stride,
                            std::int64_t out) {
    const std::int64_t span = in + 2 * pad - kernel;
    return span >= 0 && span / stride + 1 == out;
  };
  if (std::min({g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.p, g.q}) < 1) {
    why << "cuDNN takes no empty tensor";
  } else if (!symmetric(g.h, g.pad_top, g.r, g.stride_h, g.p) || !symmetric(g.w, g.pad_left, g.s, g.stride_w, g.q)) {
    why << "cuDNN pads both sides evenly, and a (" << g.p << ", " << g.q << ") output from (" << g.h << ", " << g.w
        << ") with padding (" << g.pad_top << ", " << g.pad_left << ") needs uneven padding";
  } else if (std::max({g.n * g.c * g.h * g.w, g.n * g.k * g.p * g.q, g.k * g.c * g.r * g.s}) > INT_MAX) {
    why << "cuDNN's descriptors take tensors of fewer than 2^31 elements";
  }
  return why.str();
}

template <typename T>
bool forward(const Conv2dShape& g, const T* x, const T* weights, T* y) {
  return run_pass<Pass::Forward>("conv2d_forward", g, x, weights, y);
}

template <typename T>
bool backward_input(const Conv2dShape& g, const T* dy, const T* weights, T* dx) {
  return run_pass<Pass::BackwardInput>("conv2d_backward_input", g, dy, weights, dx);
}

template <typename T>
bool backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw) {
  return run_pass<Pass::BackwardWeight>("conv2d_backward_weight", g, x, dy, dw);
}

#define SPARKGRAD_CONV2D_CUDNN(T)                                                   \
  template bool forward<T>(const Conv2dShape&, const T*, const T*, T*);          \
  template bool backward_input<T>(const Conv2dShape&, const T*, const T*, T*);   \
  template bool backward_weight<T>(const Conv2dShape&, const T*, const T*, T*);
SPARKGRAD_CONV2D_CUDNN(float)
SPARKGRAD_CONV2D_CUDNN(double)

}  // namespace sparkgrad::nn::cuda::cudnn
