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
template <typename T>
void gemm(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, T, const T*, std::int64_t, const T*,
          std::int64_t, T, T*, std::int64_t) {
  no_cuda("gemm");
}
template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

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
void accumulate(T*, const T*, std::int64_t) { no_cuda("accumulate"); }
template <typename T>
void clip(T*, std::int64_t, T) { no_cuda("clip"); }

#define SPARKGRAD_NO_CUDA_COMPRESS(T)                                                   \
  template void threshold_encode<T>(T*, std::int64_t, double, std::int64_t, std::int32_t*); \
  template HostMessage encode_smaller<T>(T*, std::int64_t, double);                    \
  template std::int64_t bitmap_encode<T>(T*, std::int64_t, double, std::int32_t*);      \
  template void decode<T>(const char*, const std::int32_t*, std::int64_t, T*, std::int64_t, std::int32_t); \
  template void accumulate<T>(T*, const T*, std::int64_t);                              \
  template void clip<T>(T*, std::int64_t, T);
SPARKGRAD_NO_CUDA_COMPRESS(float)
SPARKGRAD_NO_CUDA_COMPRESS(double)
#undef SPARKGRAD_NO_CUDA_COMPRESS

}  // namespace compress::cuda

namespace nn::cuda {

template <typename T>
void bias_add(T*, const T*, std::int64_t, std::int64_t, std::int64_t) { no_cuda("bias_add"); }
template <typename T>
void bias_grad(const T*, T*, std::int64_t, std::int64_t, std::int64_t) { no_cuda("bias_grad"); }
template <typename T>
void activation_forward(Activation, double, const T*, T*, std::int64_t, std::int64_t) {
  no_cuda("activation_forward");
}
template <typename T>
void activation_backward(Activation, double, const T*, const T*, const T*, T*, std::int64_t, std::int64_t) {
  no_cuda("activation_backward");
}
template <typename T>
void loss_score(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, std::int64_t) {
  no_cuda("loss_score");
}
template <typename T>
void loss_gradient(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t, std::int64_t) {
  no_cuda("loss_gradient");
}
ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape&, ConvAlgorithm requested) {
  if (requested == ConvAlgorithm::Winograd) {
    throw_invalid(op, "algorithm 'winograd' has no GPU kernel, use auto, cudnn or im2col");
  }
  no_cuda(op);
}
template <typename T>
void conv2d_forward(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm) {
  no_cuda("conv2d_forward");
}
template <typename T>
void conv2d_backward_input(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm) {
  no_cuda("conv2d_backward_input");
}
template <typename T>
void conv2d_backward_weight(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm) {
  no_cuda("conv2d_backward_weight");
}
template <typename T>
void pool2d_forward(PoolKind, const Pool2dShape&, const T*, T*, std::int64_t*) { no_cuda("pool2d_forward"); }
template <typename T>
void pool2d_backward(PoolKind, const Pool2dShape&, const T*, T*, const std::int64_t*) {
  no_cuda("pool2d_backward");
}
template <typename T>
void global_pool_forward(PoolKind, const T*, T*, std::int64_t*, std::int64_t, std::int64_t) {
  no_cuda("global_pool_forward");
}
template <typename T>
void global_pool_backward(PoolKind, const T*, T*, const std::int64_t*, std::int64_t, std::int64_t) {
  no_cuda("global_pool_backward");
}
template <typename T>
void batchnorm_forward_train(const BatchNormShape&, const T*, const T*, const T*, T*, T*, T*, T*, T*, double,
                             double) {
  no_cuda("batchnorm_forward_train");
}
template <typename T>
void batchnorm_forward_inference(const BatchNormShape&, const T*, const T*, const T*, const T*, const T*, T*,
                                 double) {
  no_cuda("batchnorm_forward_inference");
}
template <typename T>
void batchnorm_backward(const BatchNormShape&, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,
                        double) {
  no_cuda("batchnorm_backward");
}
template <typename T>
void dropout_forward(const T*, T*, T*, std::int64_t, double, std::uint64_t) { no_cuda("dropout_forward"); }
template <typename T>
void dropout_backward(const T*, const T*, T*, std::int64_t) { no_cuda("dropout_backward"); }
template <typename T>
void lstm_forward(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*, const T*, const T*,
                  const T*, T*, T*, T*, T*) {
  no_cuda("lstm_forward");
}
template <typename T>
void lstm_backward(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*, const T*, const T*,
                   const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, T*, std::int64_t) {
  no_cuda("lstm_backward");
}
template <typename T>
void elementwise_forward(ElementWiseOp, const T* const*, std::int64_t, T*, std::int64_t) {
  no_cuda("elementwise_forward");
}
template <typename T>
void elementwise_backward(ElementWiseOp, const T* const*, std::int64_t, const T*, T* const*, std::int64_t) {
  no_cuda("elementwise_backward");
}
template <typename T>
void scale_shift(const T*, T*, std::int64_t, double, double) { no_cuda("scale_shift"); }
template <typename T>
void l2_normalize_forward(const T*, T*, T*, std::int64_t, std::int64_t, double) { no_cuda("l2_normalize_forward"); }
template <typename T>
void l2_normalize_backward(const T*, const T*, const T*, T*, std::int64_t, std::int64_t, double) {
  no_cuda("l2_normalize_backward");
}
template <typename T>
void l2_distance_forward(const T*, const T*, T*, std::int64_t, std::int64_t) { no_cuda("l2_distance_forward"); }
template <typename T>
void l2_distance_backward(const T*, const T*, const T*, const T*, T*, T*, std::int64_t, std::int64_t, double) {
  no_cuda("l2_distance_backward");
}

#define SPARKGRAD_NO_CUDA_NN(T)                                                                                   \
  template void bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t);                            \
  template void bias_grad<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t);                           \
  template void activation_forward<T>(Activation, double, const T*, T*, std::int64_t, std::int64_t);           \
  template void activation_backward<T>(Activation, double, const T*, const T*, const T*, T*, std::int64_t,      \
                                       std::int64_t);                                                          \
  template void loss_score<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t,      \
                              std::int64_t);                                                                   \
  template void loss_gradient<T>(const LossSpec&, const T*, const T*, const T*, MaskLayout, T*, std::int64_t,   \
                                 std::int64_t);                                                                \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm);  \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm);          \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm);         \
  template void pool2d_forward<T>(PoolKind, const Pool2dShape&, const T*, T*, std::int64_t*);                 \
  template void pool2d_backward<T>(PoolKind, const Pool2dShape&, const T*, T*, const std::int64_t*);          \
  template void global_pool_forward<T>(PoolKind, const T*, T*, std::int64_t*, std::int64_t, std::int64_t);    \
  template void global_pool_backward<T>(PoolKind, const T*, T*, const std::int64_t*, std::int64_t,            \
                                        std::int64_t);                                                         \
  template void batchnorm_forward_train<T>(const BatchNormShape&, const T*, const T*, const T*, T*, T*, T*, T*, \
                                           T*, double, double);                                                \
  template void batchnorm_forward_inference<T>(const BatchNormShape&, const T*, const T*, const T*, const T*,  \
                                               const T*, T*, double);                                          \
  template void batchnorm_backward<T>(const BatchNormShape&, const T*, const T*, const T*, const T*, const T*, \
                                      T*, T*, T*, double);                                                     \
  template void dropout_forward<T>(const T*, T*, T*, std::int64_t, double, std::uint64_t);                    \
  template void dropout_backward<T>(const T*, const T*, T*, std::int64_t);                                    \
  template void lstm_forward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,      \
                                const T*, const T*, const T*, T*, T*, T*, T*);                                  \
  template void lstm_backward<T>(const LstmSpec&, const LstmShape&, const T*, const T*, const T*, const T*,     \
                                 const T*, const T*, const T*, const T*, const T*, const T*, const T*, T*, T*,  \
                                 T*, T*, T*, std::int64_t);                                                    \
  template void elementwise_forward<T>(ElementWiseOp, const T* const*, std::int64_t, T*, std::int64_t);       \
  template void elementwise_backward<T>(ElementWiseOp, const T* const*, std::int64_t, const T*, T* const*,   \
                                        std::int64_t);                                                        \
  template void scale_shift<T>(const T*, T*, std::int64_t, double, double);                                  \
  template void l2_normalize_forward<T>(const T*, T*, T*, std::int64_t, std::int64_t, double);               \
  template void l2_normalize_backward<T>(const T*, const T*, const T*, T*, std::int64_t, std::int64_t,       \
                                         double);                                                             \
  template void l2_distance_forward<T>(const T*, const T*, T*, std::int64_t, std::int64_t);                  \
  template void l2_distance_backward<T>(const T*, const T*, const T*, const T*, T*, T*, std::int64_t,        \
                                        std::int64_t, double);
SPARKGRAD_NO_CUDA_NN(float)
SPARKGRAD_NO_CUDA_NN(double)
#undef SPARKGRAD_NO_CUDA_NN

}  // namespace nn::cuda

namespace optim::cuda {

template <typename T>
void updater_apply(UpdaterKind, const UpdaterHyper&, T*, T*, std::int64_t, std::int64_t) { no_cuda("updater_apply"); }
template <typename T>
void regularize_gradient(const T*, T*, std::int64_t, double, double) { no_cuda("regularize_gradient"); }
template <typename T>
void apply_weight_decay(const T*, T*, std::int64_t, double) { no_cuda("apply_weight_decay"); }

#define SPARKGRAD_NO_CUDA_OPTIM(T)                                                                 \
  template void updater_apply<T>(UpdaterKind, const UpdaterHyper&, T*, T*, std::int64_t, std::int64_t); \
  template void regularize_gradient<T>(const T*, T*, std::int64_t, double, double);             \
  template void apply_weight_decay<T>(const T*, T*, std::int64_t, double);
SPARKGRAD_NO_CUDA_OPTIM(float)
SPARKGRAD_NO_CUDA_OPTIM(double)
#undef SPARKGRAD_NO_CUDA_OPTIM

}  // namespace optim::cuda

}  // namespace sparkgrad
