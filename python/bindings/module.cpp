// sparkgrad._core: the private native module. Each area registers its functions from its own file.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void init_common(py::module_& m);
void init_compress(py::module_& m);
void init_nn(py::module_& m);
void init_optim(py::module_& m);
void init_precision(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "sparkgrad native core (private; use the sparkgrad package)";
  init_common(m);
  init_compress(m);
  init_nn(m);
  init_optim(m);
  init_precision(m);
}
