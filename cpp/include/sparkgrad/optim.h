// Updaters and regularization over flat parameter / gradient / state vectors (CPU, OpenMP). The CUDA
// twins (cuda/optim/<same stem>.cu) implement these declarations in sparkgrad::optim::cuda; each kernel's
// one front door is its binding in python/bindings/optim.cpp, which calls the twin of the arrays' device.
#pragma once

#include <cstdint>
#include <string>

namespace sparkgrad::optim {

// ---- updaters (cpp/src/optim/updater.cpp) ---------------------------------------------------------
enum class UpdaterKind : std::uint8_t {
  Sgd, Nesterovs, Adam, AdaMax, Nadam, AmsGrad, RmsProp, AdaGrad, AdaDelta, NoOp
};
UpdaterKind parse_updater(const char* op, const std::string& name);

// Length of the flat state for n parameters: 0, n, 2n or 3n, laid out as consecutive n-blocks
// (adam: m then v; amsgrad: m, v, vhat; adamax: m, u_inf; adadelta: E[g^2], E[dx^2]).
std::int64_t updater_state_size(UpdaterKind kind, std::int64_t n);

struct UpdaterHyper {
  double learning_rate = 0.0, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, momentum = 0.9, rms_decay = 0.95,
         rho = 0.95;
};

// gradient: (n), turned in place into the update that is subtracted from the parameters;
// state: (updater_state_size(kind, n)), advanced in place. iteration is 0-based (t = iteration + 1).
template <typename T>
void updater_apply(UpdaterKind kind, const UpdaterHyper& hyper, T* gradient, T* state, std::int64_t n,
                   std::int64_t iteration);

// ---- regularization (cpp/src/optim/regularization.cpp) --------------------------------------------
// params, grad: (n). grad += l2 * params + l1 * sign(params).
template <typename T>
void regularize_gradient(const T* params, T* grad, std::int64_t n, double l1, double l2);
// params, update: (n). update += coeff * params (coeff = weight_decay * learning_rate).
template <typename T>
void apply_weight_decay(const T* params, T* update, std::int64_t n, double coeff);

// ---- CUDA twins (cuda/optim/*.cu; cuda/no_cuda.cpp throws when built without CUDA) --------------
// Same declarations and semantics; gradient, state, params, grad and update are device pointers. Each call
// queues its kernel on the calling thread's stream, as the nn twins do (nn.h).
namespace cuda {

template <typename T>
void updater_apply(UpdaterKind kind, const UpdaterHyper& hyper, T* gradient, T* state, std::int64_t n,
                   std::int64_t iteration);
template <typename T>
void regularize_gradient(const T* params, T* grad, std::int64_t n, double l1, double l2);
template <typename T>
void apply_weight_decay(const T* params, T* update, std::int64_t n, double coeff);

}  // namespace cuda

}  // namespace sparkgrad::optim
