// Fused DL4J updaters: one pass over the flat gradient turns it into the update and advances the state.
#include <algorithm>
#include <cmath>

#include "../nn/kernel_util.h"
#include "sparkgrad/common.h"
#include "sparkgrad/optim.h"

namespace sparkgrad::optim {

UpdaterKind parse_updater(const char* op, const std::string& name) {
  static const std::pair<const char*, UpdaterKind> kNames[] = {
      {"sgd", UpdaterKind::Sgd},         {"nesterovs", UpdaterKind::Nesterovs}, {"adam", UpdaterKind::Adam},
      {"adamax", UpdaterKind::AdaMax},   {"nadam", UpdaterKind::Nadam},         {"amsgrad", UpdaterKind::AmsGrad},
      {"rmsprop", UpdaterKind::RmsProp}, {"adagrad", UpdaterKind::AdaGrad},     {"adadelta", UpdaterKind::AdaDelta},
      {"noop", UpdaterKind::NoOp},
  };
  for (const auto& [key, value] : kNames) {
    if (name == key) return value;
  }
  throw_invalid(op, "unknown updater '", name,
                "', expected one of sgd nesterovs adam adamax nadam amsgrad rmsprop adagrad adadelta noop");
}

std::int64_t updater_state_size(UpdaterKind kind, std::int64_t n) {
  switch (kind) {
    case UpdaterKind::Sgd:
    case UpdaterKind::NoOp: return 0;
    case UpdaterKind::Nesterovs:
    case UpdaterKind::RmsProp:
    case UpdaterKind::AdaGrad: return n;
    case UpdaterKind::Adam:
    case UpdaterKind::AdaMax:
    case UpdaterKind::Nadam:
    case UpdaterKind::AdaDelta: return 2 * n;
    case UpdaterKind::AmsGrad: return 3 * n;
  }
  return 0;
}

template <typename T>
void updater_apply(UpdaterKind kind, const UpdaterHyper& h, T* g, T* state, std::int64_t n, std::int64_t iteration) {
  using detail::for_each_index;
  const double t = static_cast<double>(iteration) + 1.0;
  const T lr = static_cast<T>(h.learning_rate), eps = static_cast<T>(h.epsilon);
  const T b1 = static_cast<T>(h.beta1), b2 = static_cast<T>(h.beta2);
  // Bias corrections in double: 1 - beta^t loses digits in float32 for small t.
  const double corr1 = 1.0 - std::pow(h.beta1, t), corr2 = 1.0 - std::pow(h.beta2, t);
  T* s0 = state;
  T* s1 = state + n;
  T* s2 = state + 2 * n;
  switch (kind) {
    case UpdaterKind::Sgd:
      return for_each_index(n, [=](std::int64_t i) { g[i] *= lr; });
    case UpdaterKind::NoOp:
      return for_each_index(n, [=](std::int64_t i) { g[i] = T(0); });
    case UpdaterKind::Nesterovs: {
      const T mu = static_cast<T>(h.momentum);
      return for_each_index(n, [=](std::int64_t i) {
        const T v = s0[i];
        const T v_new = mu * v - lr * g[i];
        g[i] = mu * v - (T(1) + mu) * v_new;
        s0[i] = v_new;
      });
    }
    case UpdaterKind::Adam:
    case UpdaterKind::AmsGrad: {
      const T alpha_t = static_cast<T>(h.learning_rate * std::sqrt(corr2) / corr1);
      const bool ams = kind == UpdaterKind::AmsGrad;
      return for_each_index(n, [=](std::int64_t i) {
        const T m = b1 * s0[i] + (T(1) - b1) * g[i];
        const T v = b2 * s1[i] + (T(1) - b2) * g[i] * g[i];
        s0[i] = m;
        s1[i] = v;
        T denom_v = v;
        if (ams) denom_v = s2[i] = std::max(s2[i], v);
        g[i] = alpha_t * m / (std::sqrt(denom_v) + eps);
      });
    }
    case UpdaterKind::AdaMax: {
      const T alpha_t = static_cast<T>(h.learning_rate / corr1);
      return for_each_index(n, [=](std::int64_t i) {
        const T m = b1 * s0[i] + (T(1) - b1) * g[i];
        const T u = std::max(b2 * s1[i], std::abs(g[i]));
        s0[i] = m;
        s1[i] = u;
        g[i] = alpha_t * m / (u + eps);
      });
    }
    case UpdaterKind::Nadam: {
      const T m_scale = static_cast<T>(h.beta1 / (1.0 - std::pow(h.beta1, t + 1.0)));
      const T g_scale = static_cast<T>((1.0 - h.beta1) / corr1);
      const T v_scale = static_cast<T>(1.0 / corr2);
      return for_each_index(n, [=](std::int64_t i) {
        const T m = b1 * s0[i] + (T(1) - b1) * g[i];
        const T v = b2 * s1[i] + (T(1) - b2) * g[i] * g[i];
        s0[i] = m;
        s1[i] = v;
        g[i] = lr * (m_scale * m + g_scale * g[i]) / (std::sqrt(v * v_scale) + eps);
      });
    }
    case UpdaterKind::RmsProp: {
      const T d = static_cast<T>(h.rms_decay);
      return for_each_index(n, [=](std::int64_t i) {
        const T s = d * s0[i] + (T(1) - d) * g[i] * g[i];
        s0[i] = s;
        g[i] = lr * g[i] / std::sqrt(s + eps);
      });
    }
    case UpdaterKind::AdaGrad:
      return for_each_index(n, [=](std::int64_t i) {
        const T acc = s0[i] + g[i] * g[i];
        s0[i] = acc;
        g[i] = lr * g[i] / (std::sqrt(acc) + eps);
      });
    case UpdaterKind::AdaDelta: {
      const T rho = static_cast<T>(h.rho);
      return for_each_index(n, [=](std::int64_t i) {
        const T eg = rho * s0[i] + (T(1) - rho) * g[i] * g[i];
        const T u = std::sqrt(s1[i] + eps) / std::sqrt(eg + eps) * g[i];
        s0[i] = eg;
        s1[i] = rho * s1[i] + (T(1) - rho) * u * u;
        g[i] = u;
      });
    }
  }
}

template void updater_apply<float>(UpdaterKind, const UpdaterHyper&, float*, float*, std::int64_t, std::int64_t);
template void updater_apply<double>(UpdaterKind, const UpdaterHyper&, double*, double*, std::int64_t, std::int64_t);

}  // namespace sparkgrad::optim
