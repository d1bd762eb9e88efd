// Compiled when SPARKGRAD_ENABLE_CUDA is OFF: the CUDA entry points exist but report that CUDA is absent.
#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"
#include "sparkgrad/nn.h"
#include "sparkgrad/optim.h"

namespace sparkgrad {

bool cuda_available() { return false; }

namespace {
[[noreturn]] void no_cuda(const char* op) { throw_runtime(op, "sparkgrad was built without CUDA"); }
}  // namespace

// Stand-in of the template kernel `name` with the parameter types `...` (in terms of T): refuses the op,
// for float and double.
#define SPARKGRAD_NO_CUDA_KERNEL(name, ...) \
  template <typename T>                     \
  void name(__VA_ARGS__) {                  \
    no_cuda(#name);                         \
  }                                         \
  template decltype(name<float>) name<float>; \
  template decltype(name<double>) name<double>;

namespace gpu {

bool built() { return false; }
void set_stream(std::uintptr_t) {}  // every op reports the missing CUDA itself, naming the op
namespace {
bool sync_flag = false;
thread_local Precision precision_mode = Precision::Float32;  // kept so that the binding round-trips
}  // namespace
void set_sync_each_op(bool on) { sync_flag = on; }
bool sync_each_op() { return sync_flag; }
void set_precision(Precision precision) { precision_mode = precision; }
Precision current_precision() { return precision_mode; }
std::vector<DeviceInfo> devices() { no_cuda("cuda_devices"); }
SPARKGRAD_NO_CUDA_KERNEL(gemm, Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, T, const T*, std::int64_t,
                         const T*, std::int64_t, T, T*, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(gemm_strided_batched, Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, T,
                         const T*, std::int64_t, std::int64_t, const T*, std::int64_t, std::int64_t, T, T*,
                         std::int64_t, std::int64_t, std::int64_t)

}  // namespace gpu

namespace compress::cuda {

template <typename T>
void threshold_encode(T*, std::int64_t, double, std::int64_t, std::int32_t*) { no_cuda("threshold_encode"); }
std::int64_t message_entries(const std::int32_t*) { no_cuda("threshold_encode"); }
template <typename T>
HostMessage encode_smaller(T*, std::int64_t, double) { no_cuda("threshold_encode"); }
template <typename T>
std::int64_t bitmap_encode(T*, std::int64_t, double, std::int32_t*) { no_cuda("bitmap_encode"); }
template <typename T>
void decode(const char* op, const std::int32_t*, std::int64_t, T*, std::int64_t, std::int32_t) { no_cuda(op); }
template <typename T>
void subtract_sparse(const char* op, const std::int32_t*, std::int64_t, T*, std::int64_t) { no_cuda(op); }
template <typename T>
void accumulate(T*, const T*, std::int64_t) { no_cuda("accumulate"); }
template <typename T>
void clip(T*, std::int64_t, T) { no_cuda("clip"); }

#define SPARKGRAD_NO_CUDA_COMPRESS(T)                                                   \
  template void threshold_encode<T>(T*, std::int64_t, double, std::int64_t, std::int32_t*); \
  template HostMessage encode_smaller<T>(T*, std::int64_t, double);                    \
  template std::int64_t bitmap_encode<T>(T*, std::int64_t, double, std::int32_t*);      \
  template void decode<T>(const char*, const std::int32_t*, std::int64_t, T*, std::int64_t, std::int32_t); \
  template void subtract_sparse<T>(const char*, const std::int32_t*, std::int64_t, T*, std::int64_t); \
  template void accumulate<T>(T*, const T*, std::int64_t);                              \
  template void clip<T>(T*, std::int64_t, T);
SPARKGRAD_NO_CUDA_COMPRESS(float)
SPARKGRAD_NO_CUDA_COMPRESS(double)
#undef SPARKGRAD_NO_CUDA_COMPRESS

}  // namespace compress::cuda

namespace nn::cuda {

ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape&, ConvAlgorithm requested) {
  if (requested == ConvAlgorithm::Winograd) {
    throw_invalid(op, "algorithm 'winograd' has no GPU kernel, use auto, cudnn or im2col");
  }
  no_cuda(op);
}
SPARKGRAD_NO_CUDA_KERNEL(bias_add, T*, const T*, std::int64_t, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(bias_grad, const T*, T*, std::int64_t, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(swap_last_axes, const T*, T*, std::int64_t, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(activation_forward, Activation, double, const T*, T*, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(activation_backward, Activation, double, const T*, const T*, const T*, T*, std::int64_t,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(loss_score, const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(loss_gradient, const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(conv2d_forward, const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm)
SPARKGRAD_NO_CUDA_KERNEL(conv2d_backward_input, const Conv2dShape&, const T*, const T*, const T*, T*, bool,
                         ConvAlgorithm)
SPARKGRAD_NO_CUDA_KERNEL(conv2d_backward_weight, const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm)
SPARKGRAD_NO_CUDA_KERNEL(conv2d_forward_backward_weight, const Conv2dShape&, const T*, const T*, const T*, T*, T*,
                         ConvAlgorithm)
SPARKGRAD_NO_CUDA_KERNEL(pool2d_forward, PoolKind, const Pool2dShape&, const T*, T*, std::int64_t*)
SPARKGRAD_NO_CUDA_KERNEL(pool2d_backward, PoolKind, const Pool2dShape&, const T*, T*, const std::int64_t*)
SPARKGRAD_NO_CUDA_KERNEL(global_pool_forward, PoolKind, const T*, T*, std::int64_t*, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(global_pool_backward, PoolKind, const T*, T*, const std::int64_t*, std::int64_t,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(batchnorm_forward_train, const BatchNormShape&, const T*, const T*, const T*, T*, T*, T*, T*,
                         T*, double, double)
SPARKGRAD_NO_CUDA_KERNEL(batchnorm_forward_inference, const BatchNormShape&, const T*, const T*, const T*, const T*,
                         const T*, T*, double)
SPARKGRAD_NO_CUDA_KERNEL(batchnorm_backward, const BatchNormShape&, const T*, const T*, const T*, const T*, const T*,
                         T*, T*, T*, double)
SPARKGRAD_NO_CUDA_KERNEL(layer_norm_forward, const T*, const T*, const T*, T*, T*, T*, std::int64_t, std::int64_t,
                         double)
SPARKGRAD_NO_CUDA_KERNEL(layer_norm_backward, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,
                         std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(attention_forward, const AttentionShape&, const T*, const T*, const T*, const T*, double, T*,
                         T*)
SPARKGRAD_NO_CUDA_KERNEL(attention_backward, const AttentionShape&, const T*, const T*, const T*, const T*, const T*,
                         double, T*, T*, T*, T*)
SPARKGRAD_NO_CUDA_KERNEL(dropout_forward, const T*, T*, T*, std::int64_t, double, std::uint64_t)
SPARKGRAD_NO_CUDA_KERNEL(dropout_backward, const T*, const T*, T*, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(embedding_forward, const std::int64_t*, const T*, T*, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t*)
SPARKGRAD_NO_CUDA_KERNEL(embedding_backward, const std::int64_t*, const T*, T*, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t*)
SPARKGRAD_NO_CUDA_KERNEL(lstm_forward, const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,
                         const T*, const T*, const T*, T*, T*, T*, T*)
SPARKGRAD_NO_CUDA_KERNEL(lstm_backward, const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,
                         const T*, const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(gru_forward, const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,
                         const T*, const T*, T*, T*)
SPARKGRAD_NO_CUDA_KERNEL(gru_backward, const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,
                         const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(simple_rnn_forward, Activation, double, const LstmShape&, const T*, const T*, const T*,
                         const T*, const T*, const T*, T*, T*)
SPARKGRAD_NO_CUDA_KERNEL(simple_rnn_backward, Activation, double, const LstmShape&, const T*, const T*, const T*,
                         const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(elementwise_forward, ElementWiseOp, const T* const*, std::int64_t, T*, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(elementwise_backward, ElementWiseOp, const T* const*, std::int64_t, const T*, T* const*,
                         std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(scale_shift, const T*, T*, std::int64_t, double, double)
SPARKGRAD_NO_CUDA_KERNEL(l2_normalize_forward, const T*, T*, T*, std::int64_t, std::int64_t, double)
SPARKGRAD_NO_CUDA_KERNEL(l2_normalize_backward, const T*, const T*, const T*, T*, std::int64_t, std::int64_t, double)
SPARKGRAD_NO_CUDA_KERNEL(l2_distance_forward, const T*, const T*, T*, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(l2_distance_backward, const T*, const T*, const T*, const T*, T*, T*, std::int64_t,
                         std::int64_t, double)

}  // namespace nn::cuda

namespace optim::cuda {

SPARKGRAD_NO_CUDA_KERNEL(updater_apply, UpdaterKind, const UpdaterHyper&, T*, T*, std::int64_t, std::int64_t)
SPARKGRAD_NO_CUDA_KERNEL(regularize_gradient, const T*, T*, std::int64_t, double, double)
SPARKGRAD_NO_CUDA_KERNEL(apply_weight_decay, const T*, T*, std::int64_t, double)

}  // namespace optim::cuda

#undef SPARKGRAD_NO_CUDA_KERNEL

}  // namespace sparkgrad
