// L1 / L2 gradient regularization and decoupled weight decay over one layer's flat weight view.
#include "../nn/kernel_util.h"
#include "sparkgrad/optim.h"

namespace sparkgrad::optim {

template <typename T>
void regularize_gradient(const T* params, T* grad, std::int64_t n, double l1_in, double l2_in) {
  const T l1 = static_cast<T>(l1_in), l2 = static_cast<T>(l2_in);
  detail::for_each_index(n, [=](std::int64_t i) {
    const T w = params[i];
    const T sign = w > T(0) ? T(1) : (w < T(0) ? T(-1) : T(0));
    grad[i] += l2 * w + l1 * sign;
  });
}

template <typename T>
void apply_weight_decay(const T* params, T* update, std::int64_t n, double coeff_in) {
  const T coeff = static_cast<T>(coeff_in);
  detail::for_each_index(n, [=](std::int64_t i) { update[i] += coeff * params[i]; });
}

#define SPARKGRAD_REGULARIZATION(T)                                                        \
  template void regularize_gradient<T>(const T*, T*, std::int64_t, double, double);      \
  template void apply_weight_decay<T>(const T*, T*, std::int64_t, double);
SPARKGRAD_REGULARIZATION(float)
SPARKGRAD_REGULARIZATION(double)

}  // namespace sparkgrad::optim
