// GEMM and conv2d throughput (GFLOP/s, float32) for 1 and 2 threads. Reference ratios, measured in the
// same run: `vs_1_thread` (speed-up over the 1-thread line of the same configuration) and, for conv,
// `vs_gemm` (the conv pass against one bare OpenBLAS GEMM of the same total (m, n, k) im2col product;
// > 1 means the per-image, cache-resident formulation beats the batch-wide GEMM).
//   build: cmake -S . -B build/bench -G Ninja -DSPARKGRAD_BUILD_BENCH=ON \
//            -DPython_EXECUTABLE=... -Dpybind11_DIR=... && cmake --build build/bench --target bench_nn
//   run:   build/bench/bench/cpp/bench_nn
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

using namespace sparkgrad;

namespace {

// Best seconds per call over 5 rounds of enough calls to fill ~50 ms each.
double time_call(const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();
  int reps = 1;
  for (;;) {
    const auto start = clock::now();
    for (int i = 0; i < reps; ++i) fn();
    if (std::chrono::duration<double>(clock::now() - start).count() > 0.05) break;
    reps *= 2;
  }
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = clock::now();
    for (int i = 0; i < reps; ++i) fn();
    best = std::min(best, std::chrono::duration<double>(clock::now() - start).count() / reps);
  }
  return best;
}

std::vector<float> random_vector(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Seconds of c(m, n) = a(m, k) @ b(k, n).
double time_gemm(std::int64_t m, std::int64_t n, std::int64_t k) {
  auto a = random_vector(m * k, 1), b = random_vector(k * n, 2);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  return time_call([&] {
    gemm<float>(Transpose::No, Transpose::No, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  });
}

// Seconds per call of the 1-thread run, keyed by line label.
std::map<std::string, double> one_thread;

void report(int threads, const std::string& label, double flops, double seconds, const char* extra) {
  if (threads == 1) one_thread[label] = seconds;
  std::printf("threads=%d  %-52s %8.2f GFLOP/s  %8.3f ms  vs_1_thread=%.2f%s\n", threads, label.c_str(),
              flops / seconds / 1e9, seconds * 1e3, one_thread[label] / seconds, extra);
}

void bench_gemm(int threads, std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::string label = "gemm m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
  report(threads, label, 2.0 * m * n * k, time_gemm(m, n, k), "");
}

void bench_conv(int threads, const std::string& name, const nn::Conv2dShape& g) {
  auto x = random_vector(g.n * g.c * g.h * g.w, 3), w = random_vector(g.k * g.c * g.r * g.s, 4);
  auto b = random_vector(g.k, 5), dy = random_vector(g.n * g.k * g.p * g.q, 6);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  const std::int64_t crs = g.c * g.r * g.s, npq = g.n * g.p * g.q;
  const double flops = 2.0 * g.k * crs * npq;  // each pass is one (k x crs x n*p*q) product
  struct Pass {
    const char* label;
    std::function<void()> run;
    double gemm_seconds;
  } passes[] = {
      {"forward", [&] { nn::conv2d_forward<float>(g, x.data(), w.data(), b.data(), y.data()); },
       time_gemm(g.k, npq, crs)},
      {"backward_input", [&] { nn::conv2d_backward_input<float>(g, dy.data(), w.data(), dx.data()); },
       time_gemm(crs, npq, g.k)},
      {"backward_weight", [&] { nn::conv2d_backward_weight<float>(g, x.data(), dy.data(), dw.data()); },
       time_gemm(g.k, crs, npq)},
  };
  for (const Pass& pass : passes) {
    const double seconds = time_call(pass.run);
    char extra[64];
    std::snprintf(extra, sizeof extra, "  vs_gemm=%.2f", pass.gemm_seconds / seconds);
    report(threads, "conv2d " + name + " " + pass.label, flops, seconds, extra);
  }
}

}  // namespace

int main() {
  std::printf("# %s\n", blas_info().c_str());
  // LeNet, batch 64: 1x28x28 -> 20 5x5 -> (pool) 20x12x12 -> 50 5x5; plus a "same"-padded 3x3 layer.
  const nn::Conv2dShape lenet1{64, 1, 28, 28, 20, 5, 5, 24, 24, 1, 1, 0, 0};
  const nn::Conv2dShape lenet2{64, 20, 12, 12, 50, 5, 5, 8, 8, 1, 1, 0, 0};
  const nn::Conv2dShape same3x3{64, 16, 28, 28, 32, 3, 3, 28, 28, 1, 1, 1, 1};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    bench_gemm(threads, 1024, 1024, 1024);
    bench_gemm(threads, 128, 1024, 784);
    bench_gemm(threads, 128, 512, 1024);
    bench_conv(threads, "lenet1 64x1x28x28 k20 5x5", lenet1);
    bench_conv(threads, "lenet2 64x20x12x12 k50 5x5", lenet2);
    bench_conv(threads, "same 64x16x28x28 k32 3x3", same3x3);
  }
  return 0;
}
