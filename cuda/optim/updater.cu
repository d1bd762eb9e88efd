// CUDA twin of cpp/src/optim/updater.cpp: one fused pass over the flat gradient turns it into the update
// and advances the state; per-step scalars (bias corrections in double) are computed on the host.
#include <cmath>

#include "../nn/kernel_util.cuh"
#include "sparkgrad/optim.h"

namespace sparkgrad::optim::cuda {

namespace {
using namespace sparkgrad::detail::cuda;

template <typename T>
struct Scalars {
  T lr, eps, b1, b2, mu, decay, rho;
  T alpha_t;                     // adam / amsgrad / adamax step size
  T m_scale, g_scale, v_scale;  // nadam
};

// g, s0, s1, s2: (n) each; s1, s2 only for the kinds whose state has them.
template <typename T>
__global__ void updater_kernel(UpdaterKind kind, Scalars<T> k, T* g, T* s0, T* s1, T* s2, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    switch (kind) {
      case UpdaterKind::Sgd: g[i] *= k.lr; break;
      case UpdaterKind::NoOp: g[i] = T(0); break;
      case UpdaterKind::Nesterovs: {
        const T v = s0[i];
        const T v_new = k.mu * v - k.lr * g[i];
        g[i] = k.mu * v - (T(1) + k.mu) * v_new;
        s0[i] = v_new;
        break;
      }
      case UpdaterKind::Adam:
      case UpdaterKind::AmsGrad: {
        const T m = k.b1 * s0[i] + (T(1) - k.b1) * g[i];
        const T v = k.b2 * s1[i] + (T(1) - k.b2) * g[i] * g[i];
        s0[i] = m;
        s1[i] = v;
        T denom_v = v;
        if (kind == UpdaterKind::AmsGrad) denom_v = s2[i] = fmax(s2[i], v);
        g[i] = k.alpha_t * m / (sqrt(denom_v) + k.eps);
        break;
      }
      case UpdaterKind::AdaMax: {
        const T m = k.b1 * s0[i] + (T(1) - k.b1) * g[i];
        const T u = fmax(k.b2 * s1[i], fabs(g[i]));
        s0[i] = m;
        s1[i] = u;
        g[i] = k.alpha_t * m / (u + k.eps);
        break;
      }
      case UpdaterKind::Nadam: {
        const T m = k.b1 * s0[i] + (T(1) - k.b1) * g[i];
        const T v = k.b2 * s1[i] + (T(1) - k.b2) * g[i] * g[i];
        s0[i] = m;
        s1[i] = v;
        g[i] = k.lr * (k.m_scale * m + k.g_scale * g[i]) / (sqrt(v * k.v_scale) + k.eps);
        break;
      }
      case UpdaterKind::RmsProp: {
        const T s = k.decay * s0[i] + (T(1) - k.decay) * g[i] * g[i];
        s0[i] = s;
        g[i] = k.lr * g[i] / sqrt(s + k.eps);
        break;
      }
      case UpdaterKind::AdaGrad: {
        const T acc = s0[i] + g[i] * g[i];
        s0[i] = acc;
        g[i] = k.lr * g[i] / (sqrt(acc) + k.eps);
        break;
      }
      case UpdaterKind::AdaDelta: {
        const T eg = k.rho * s0[i] + (T(1) - k.rho) * g[i] * g[i];
        const T u = sqrt(s1[i] + k.eps) / sqrt(eg + k.eps) * g[i];
        s0[i] = eg;
        s1[i] = k.rho * s1[i] + (T(1) - k.rho) * u * u;
        g[i] = u;
        break;
      }
    }
  }
}

}  // namespace

template <typename T>
void updater_apply(UpdaterKind kind, const UpdaterHyper& h, T* g, T* state, std::int64_t n, std::int64_t iteration) {
  if (n == 0) return;
  const double t = static_cast<double>(iteration) + 1.0;
  const double corr1 = 1.0 - std::pow(h.beta1, t), corr2 = 1.0 - std::pow(h.beta2, t);
  Scalars<T> k{};
  k.lr = static_cast<T>(h.learning_rate);
  k.eps = static_cast<T>(h.epsilon);
  k.b1 = static_cast<T>(h.beta1);
  k.b2 = static_cast<T>(h.beta2);
  k.mu = static_cast<T>(h.momentum);
  k.decay = static_cast<T>(h.rms_decay);
  k.rho = static_cast<T>(h.rho);
  k.alpha_t = static_cast<T>(kind == UpdaterKind::AdaMax ? h.learning_rate / corr1
                                                         : h.learning_rate * std::sqrt(corr2) / corr1);
  k.m_scale = static_cast<T>(h.beta1 / (1.0 - std::pow(h.beta1, t + 1.0)));
  k.g_scale = static_cast<T>((1.0 - h.beta1) / corr1);
  k.v_scale = static_cast<T>(1.0 / corr2);
  updater_kernel<<<blocks_for(n), kThreads, 0, gpu::current_stream()>>>(kind, k, g, state, state + n, state + 2 * n, n);
  check_kernels("updater_apply");
}

template void updater_apply<float>(UpdaterKind, const UpdaterHyper&, float*, float*, std::int64_t, std::int64_t);
template void updater_apply<double>(UpdaterKind, const UpdaterHyper&, double*, double*, std::int64_t, std::int64_t);

}  // namespace sparkgrad::optim::cuda
