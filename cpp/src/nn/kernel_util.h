// Private helpers shared by the nn and optim CPU kernels.
#pragma once

#include <cstdint>

namespace sparkgrad::detail {

// Elementwise loops below this many values run on one thread: forking costs more than it saves.
constexpr std::int64_t kParallelMin = 1 << 15;

}  // namespace sparkgrad::detail

