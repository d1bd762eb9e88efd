// Bindings of the updater and regularization kernels (cpp/include/sparkgrad/optim.h): one front door per
// kernel for host and device arrays, checked once (ArrayView), then optim::f or optim::cuda::f with the GIL
// released.
#include "kernel_args.h"
#include "sparkgrad/optim.h"

namespace py = pybind11;
using namespace sparkgrad;
using namespace sparkgrad::bindings;

namespace {

void updater_apply(const std::string& name, py::handle grad_in, py::handle state_in, std::int64_t iteration,
                   const optim::UpdaterHyper& hyper) {
  const char* op = "updater_apply";
  const optim::UpdaterKind kind = optim::parse_updater(op, name);
  require_non_negative(op, "iteration", iteration);
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0)) throw_invalid(op, "beta1 must be in [0, 1), got ", hyper.beta1);
  if (!(hyper.beta2 >= 0.0 && hyper.beta2 < 1.0)) throw_invalid(op, "beta2 must be in [0, 1), got ", hyper.beta2);
  if (!(hyper.epsilon >= 0.0)) throw_invalid(op, "epsilon must be >= 0, got ", hyper.epsilon);
  const ArrayView grad(op, "gradient", grad_in), state(op, "state", state_in);
  const Place place = common_place(op, {&grad, &state});
  dispatch_float(op, grad, [&](auto tag) {
    using T = decltype(tag);
    grad.require<T>(true);
    state.require<T>(true);
    grad.require_ndim({1}, "1-D");
    const std::int64_t n = grad.shape(0);
    state.require_shape({optim::updater_state_size(kind, n)});
    SPARKGRAD_RUN_TWIN(place, optim, updater_apply<T>, kind, hyper, grad.mutable_data<T>(), state.mutable_data<T>(),
                       n, iteration);
  });
}

void regularize_gradient(py::handle params_in, py::handle grad_in, double l1, double l2) {
  const char* op = "regularize_gradient";
  const ArrayView params(op, "params", params_in), grad(op, "grad", grad_in);
  const Place place = common_place(op, {&params, &grad});
  dispatch_float(op, params, [&](auto tag) {
    using T = decltype(tag);
    params.require<T>();
    grad.require<T>(true);
    grad.require_shape(params.shape());
    SPARKGRAD_RUN_TWIN(place, optim, regularize_gradient<T>, params.data<T>(), grad.mutable_data<T>(), params.size(),
                       l1, l2);
  });
}

void apply_weight_decay(py::handle params_in, py::handle update_in, double coeff) {
  const char* op = "apply_weight_decay";
  const ArrayView params(op, "params", params_in), update(op, "update", update_in);
  const Place place = common_place(op, {&params, &update});
  dispatch_float(op, params, [&](auto tag) {
    using T = decltype(tag);
    params.require<T>();
    update.require<T>(true);
    update.require_shape(params.shape());
    SPARKGRAD_RUN_TWIN(place, optim, apply_weight_decay<T>, params.data<T>(), update.mutable_data<T>(),
                       params.size(), coeff);
  });
}

}  // namespace

void init_optim(py::module_& m) {
  m.def(
      "updater_state_size",
      [](const std::string& kind, std::int64_t n) {
        require_non_negative("updater_state_size", "n", n);
        return optim::updater_state_size(optim::parse_updater("updater_state_size", kind), n);
      },
      py::arg("kind"), py::arg("n"), "Length of the flat updater state for n parameters.");
  m.def(
      "updater_apply",
      [](const std::string& kind, py::handle gradient, py::handle state, std::int64_t iteration, double learning_rate,
         double beta1, double beta2, double epsilon, double momentum, double rms_decay, double rho) {
        updater_apply(kind, gradient, state, iteration,
                      optim::UpdaterHyper{learning_rate, beta1, beta2, epsilon, momentum, rms_decay, rho});
      },
      py::arg("kind"), py::arg("gradient"), py::arg("state"), py::arg("iteration"), py::arg("learning_rate") = 0.0,
      py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8, py::arg("momentum") = 0.9,
      py::arg("rms_decay") = 0.95, py::arg("rho") = 0.95,
      "Turns the flat gradient (in place) into the update to subtract and advances the flat state.");
  m.def("regularize_gradient", &regularize_gradient, py::arg("params"), py::arg("grad"), py::arg("l1"),
        py::arg("l2"), "grad += l2 * params + l1 * sign(params), in place.");
  m.def("apply_weight_decay", &apply_weight_decay, py::arg("params"), py::arg("update"), py::arg("coeff"),
        "update += coeff * params, in place.");
}
