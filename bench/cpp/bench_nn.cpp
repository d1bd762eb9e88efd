// GEMM, conv2d and LSTM throughput (GFLOP/s, float32), on the CPU or on the GPU.
//   bench_nn [--device cpu|cuda]
// cpu (default): every configuration at 1 and 2 threads; `vs_1_thread` = speed-up over the 1-thread line
//   of the same configuration.
// cuda: the same configurations through cuBLAS and the CUDA twins (cuda/nn); `vs_cpu` = the CPU time with
//   all of this machine's threads (measured in the same run) over the GPU time. Needs a CUDA build
//   (-DSPARKGRAD_ENABLE_CUDA=ON) and a visible GPU; says which is missing otherwise.
// Both: `vs_gemm` for conv = one bare GEMM of the same total (m, n, k) im2col product on the same device
//   over the conv pass (> 1: the conv beats the batch-wide GEMM); `of_peak` = the conv's rate over the
//   1024^3 sgemm's of the same run. On the CPU each conv pass has one line per algorithm (bench_conv). LSTM FLOPs count its
//   GEMMs (the gate arithmetic is a few percent): forward 2 n t (c + h) 4h, backward 2 n t 4h (2c + 2h).
//   build: cmake -S . -B build/bench -G Ninja -DSPARKGRAD_BUILD_BENCH=ON [-DSPARKGRAD_ENABLE_CUDA=ON] \
//            -DPython_EXECUTABLE=... -Dpybind11_DIR=... && cmake --build build/bench --target bench_nn
//   run:   build/bench/bench/cpp/bench_nn [--device cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef SPARKGRAD_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

using namespace sparkgrad;

namespace {

enum class Device { Cpu, Cuda };

// Device memory of the cuda mode. main() checks gpu::built() before any use, so the CPU build's
// versions only exist to link.
#ifdef SPARKGRAD_HAS_CUDA
void check(cudaError_t status) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(status));
}
float* device_copy(const std::vector<float>& host) {
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, sizeof(float) * std::max<std::size_t>(host.size(), 1)));
  check(cudaMemcpy(ptr, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice));
  return static_cast<float*>(ptr);
}
void device_free(float* ptr) { cudaFree(ptr); }
void device_sync() { check(cudaDeviceSynchronize()); }
#else
[[noreturn]] void no_cuda() { throw std::runtime_error("bench_nn was built without CUDA"); }
float* device_copy(const std::vector<float>&) { no_cuda(); }
void device_free(float*) {}
void device_sync() { no_cuda(); }
#endif

std::vector<float> random_vector(std::int64_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// n float32 values drawn from N(0, scale^2), on the host or on the GPU.
class Buffer {
 public:
  Buffer(Device device, std::int64_t n, unsigned seed, float scale = 1.0f)
      : host_(random_vector(n, seed, scale)), device_(device == Device::Cuda ? device_copy(host_) : nullptr) {}
  ~Buffer() {
    if (device_ != nullptr) device_free(device_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() { return device_ != nullptr ? device_ : host_.data(); }

 private:
  std::vector<float> host_;
  float* device_;
};

// Best seconds per call over 5 rounds of enough calls to fill ~50 ms each; GPU calls end synchronized.
double time_call(Device device, const std::function<void()>& call) {
  using clock = std::chrono::steady_clock;
  const auto fn = [&] {
    call();
    if (device == Device::Cuda) device_sync();
  };
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

// Row-major c(m, n) = a(m, k) @ b(k, n) on the device (OpenBLAS or cuBLAS).
void gemm_on(Device device, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b, float* c) {
  if (device == Device::Cuda) {
    gpu::gemm<float>(Transpose::No, Transpose::No, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  } else {
    gemm<float>(Transpose::No, Transpose::No, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  }
}

double time_gemm(Device device, std::int64_t m, std::int64_t n, std::int64_t k) {
  Buffer a(device, m * k, 1), b(device, k * n, 2), c(device, m * n, 0);
  return time_call(device, [&] { gemm_on(device, m, n, k, a.get(), b.get(), c.get()); });
}

struct Line {
  std::string label;
  double flops, seconds;
  std::string extra;
};

void bench_gemm(Device device, std::vector<Line>& out, std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::string label = "gemm m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
  out.push_back({label, 2.0 * m * n * k, time_gemm(device, m, n, k), ""});
}

// Every pass of one conv shape, per algorithm on the CPU (im2col + GEMM; Winograd F(2x2, 3x3) where it
// applies; "auto" is whichever conv2d picks), one line each on the GPU. GFLOP/s count the direct
// convolution's 2 k c r s n p q multiply-adds for every algorithm, so Winograd's fewer multiplications show
// as a higher rate; `of_peak` is that rate over the sgemm peak measured in the same run.
void bench_conv(Device device, std::vector<Line>& out, const std::string& name, const nn::Conv2dShape& g,
                double peak) {
  const bool gpu = device == Device::Cuda;
  Buffer x(device, g.n * g.c * g.h * g.w, 3), w(device, g.k * g.c * g.r * g.s, 4), b(device, g.k, 5);
  Buffer dy(device, g.n * g.k * g.p * g.q, 6), y(device, g.n * g.k * g.p * g.q, 0);
  Buffer dx(device, g.n * g.c * g.h * g.w, 0), dw(device, g.k * g.c * g.r * g.s, 0);
  const std::int64_t crs = g.c * g.r * g.s, npq = g.n * g.p * g.q;
  const double flops = 2.0 * g.k * crs * npq;  // each pass is one (k x crs x n*p*q) product
  const double gemm_seconds[3] = {time_gemm(device, g.k, npq, crs), time_gemm(device, crs, npq, g.k),
                                  time_gemm(device, g.k, crs, npq)};
  std::vector<std::pair<std::string, nn::ConvAlgorithm>> algorithms = {{"", nn::ConvAlgorithm::Auto}};
  if (!gpu) {
    const bool winograd = nn::conv2d_winograd_applies(g);
    const bool auto_winograd = nn::conv2d_algorithm("bench", g, nn::ConvAlgorithm::Auto) == nn::ConvAlgorithm::Winograd;
    algorithms = {{"im2col", nn::ConvAlgorithm::Im2col}};
    if (winograd) algorithms.push_back({"winograd", nn::ConvAlgorithm::Winograd});
    for (auto& [label, algorithm] : algorithms) {
      if ((algorithm == nn::ConvAlgorithm::Winograd) == auto_winograd) label += "(auto)";
    }
  }
  for (const auto& [label, algorithm] : algorithms) {
    const nn::ConvAlgorithm a = algorithm;
    const std::function<void()> passes[3] = {
        [&] {
          if (gpu) nn::cuda::conv2d_forward<float>(g, x.get(), w.get(), b.get(), y.get());
          else nn::conv2d_forward<float>(g, x.get(), w.get(), b.get(), y.get(), false, a);
        },
        [&] {
          if (gpu) nn::cuda::conv2d_backward_input<float>(g, dy.get(), w.get(), nullptr, dx.get());
          else nn::conv2d_backward_input<float>(g, dy.get(), w.get(), nullptr, dx.get(), false, a);
        },
        [&] {
          if (gpu) nn::cuda::conv2d_backward_weight<float>(g, x.get(), dy.get(), dw.get());
          else nn::conv2d_backward_weight<float>(g, x.get(), dy.get(), dw.get(), a);
        },
    };
    const char* pass_names[3] = {"forward", "backward_input", "backward_weight"};
    for (int pass = 0; pass < 3; ++pass) {
      const double seconds = time_call(device, passes[pass]);
      char extra[96];
      std::snprintf(extra, sizeof extra, "  vs_gemm=%.2f  of_peak=%.2f", gemm_seconds[pass] / seconds,
                    flops / seconds / peak);
      const std::string variant = label.empty() ? "" : " " + label;
      out.push_back({"conv2d " + name + " " + pass_names[pass] + variant, flops, seconds, extra});
    }
  }
}

// One LSTM layer over a whole sequence (tanh / sigmoid), forward and backward with dx.
void bench_lstm(Device device, std::vector<Line>& out, const nn::LstmShape& s) {
  const bool gpu = device == Device::Cuda;
  const std::int64_t n = s.n, t = s.t, c = s.c, h = s.h, g4 = 4 * s.h;
  const nn::LstmSpec spec{nn::Activation::Tanh, 0.0, nn::Activation::Sigmoid, 0.0};
  const float init = 1.0f / static_cast<float>(h);  // keeps the gates out of saturation, as trained nets do
  Buffer x(device, n * t * c, 7), w(device, c * g4, 8, init), rw(device, h * g4, 9, init), b(device, g4, 10, init);
  Buffer hs(device, n * t * h, 0), cs(device, n * t * h, 0), act_c(device, n * t * h, 0), gates(device, n * t * g4, 0);
  Buffer dh(device, n * t * h, 11), dgates(device, n * t * g4, 0), dx(device, n * t * c, 0);
  Buffer dw(device, c * g4, 0), drw(device, h * g4, 0), db(device, g4, 0);
  const auto forward = [&] {
    if (gpu) {
      nn::cuda::lstm_forward<float>(spec, s, x.get(), w.get(), rw.get(), b.get(), nullptr, nullptr, nullptr, hs.get(),
                                    cs.get(), gates.get(), act_c.get());
    } else {
      nn::lstm_forward<float>(spec, s, x.get(), w.get(), rw.get(), b.get(), nullptr, nullptr, nullptr, hs.get(),
                              cs.get(), gates.get(), act_c.get());
    }
  };
  const auto backward = [&] {
    if (gpu) {
      nn::cuda::lstm_backward<float>(spec, s, x.get(), w.get(), rw.get(), nullptr, nullptr, nullptr, hs.get(), cs.get(),
                                     gates.get(), act_c.get(), dh.get(), dgates.get(), dx.get(), dw.get(), drw.get(),
                                     db.get(), 0);
    } else {
      nn::lstm_backward<float>(spec, s, x.get(), w.get(), rw.get(), nullptr, nullptr, nullptr, hs.get(), cs.get(),
                               gates.get(), act_c.get(), dh.get(), dgates.get(), dx.get(), dw.get(), drw.get(),
                               db.get(), 0);
    }
  };
  const std::string name = "lstm n=" + std::to_string(n) + " t=" + std::to_string(t) + " c=" + std::to_string(c) +
                           " h=" + std::to_string(h);
  out.push_back({name + " forward", 2.0 * n * t * (c + h) * g4, time_call(device, forward), ""});
  out.push_back({name + " backward", 2.0 * n * t * g4 * (2 * c + 2 * h), time_call(device, backward), ""});
}

std::vector<Line> run_all(Device device) {
  // LeNet, batch 64: 1x28x28 -> 20 5x5 -> (pool) 20x12x12 -> 50 5x5; the residual CNN of
  // bench/python/bench_train_step.py (batch 64, "same" 3x3: 16 channels at 28x28, 16 -> 32 and 32 at
  // 14x14); two CIFAR-shaped layers (32 channels at 32x32, 64 at 16x16); the LSTM of bench_lstm.py
  // (batch 64, 50 steps, input 64, hidden 256). The 1024^3 sgemm is the peak the conv lines compare with.
  std::vector<Line> out;
  bench_gemm(device, out, 1024, 1024, 1024);
  const double peak = out.back().flops / out.back().seconds;
  bench_gemm(device, out, 128, 1024, 784);
  bench_gemm(device, out, 128, 512, 1024);
  bench_conv(device, out, "lenet1 64x1x28x28 k20 5x5", {64, 1, 28, 28, 20, 5, 5, 24, 24, 1, 1, 0, 0}, peak);
  bench_conv(device, out, "lenet2 64x20x12x12 k50 5x5", {64, 20, 12, 12, 50, 5, 5, 8, 8, 1, 1, 0, 0}, peak);
  bench_conv(device, out, "resnet 64x16x28x28 k16 3x3", {64, 16, 28, 28, 16, 3, 3, 28, 28, 1, 1, 1, 1}, peak);
  bench_conv(device, out, "resnet 64x16x14x14 k32 3x3", {64, 16, 14, 14, 32, 3, 3, 14, 14, 1, 1, 1, 1}, peak);
  bench_conv(device, out, "resnet 64x32x14x14 k32 3x3", {64, 32, 14, 14, 32, 3, 3, 14, 14, 1, 1, 1, 1}, peak);
  bench_conv(device, out, "same 64x16x28x28 k32 3x3", {64, 16, 28, 28, 32, 3, 3, 28, 28, 1, 1, 1, 1}, peak);
  bench_conv(device, out, "cifar 64x32x32x32 k32 3x3", {64, 32, 32, 32, 32, 3, 3, 32, 32, 1, 1, 1, 1}, peak);
  bench_conv(device, out, "cifar 64x64x16x16 k64 3x3", {64, 64, 16, 16, 64, 3, 3, 16, 16, 1, 1, 1, 1}, peak);
  bench_lstm(device, out, {64, 50, 64, 256});
  return out;
}

void print(const char* where, const Line& line, const char* ratio_name, double ratio) {
  std::printf("%s  %-62s %8.2f GFLOP/s  %8.3f ms  %s=%.2f%s\n", where, line.label.c_str(),
              line.flops / line.seconds / 1e9, line.seconds * 1e3, ratio_name, ratio, line.extra.c_str());
}

int bench_cpu() {
  std::printf("# %s\n", blas_info().c_str());
  std::map<std::string, double> one_thread;  // seconds per call of the 1-thread run, by label
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const std::string where = "threads=" + std::to_string(threads);
    for (const Line& line : run_all(Device::Cpu)) {
      if (threads == 1) one_thread[line.label] = line.seconds;
      print(where.c_str(), line, "vs_1_thread", one_thread[line.label] / line.seconds);
    }
  }
  return 0;
}

int bench_cuda() {
  if (!gpu::built()) {
    std::fprintf(stderr, "bench_nn: --device cuda needs a CUDA build: configure with -DSPARKGRAD_ENABLE_CUDA=ON\n");
    return 1;
  }
  const std::vector<gpu::DeviceInfo> gpus = gpu::devices();
  if (gpus.empty()) {
    std::fprintf(stderr, "bench_nn: --device cuda: the CUDA runtime sees no GPU (no driver or no device)\n");
    return 1;
  }
  const gpu::DeviceInfo& d = gpus.front();
  std::printf("# GPU 0: %s, compute capability %d.%d, %.1f GiB; CPU reference: %s, %d threads\n", d.name.c_str(),
              d.major, d.minor, static_cast<double>(d.total_memory) / (1 << 30), blas_info().c_str(), max_threads());
  std::map<std::string, double> cpu;
  for (const Line& line : run_all(Device::Cpu)) cpu[line.label] = line.seconds;
  for (const Line& line : run_all(Device::Cuda)) print("device=cuda", line, "vs_cpu", cpu[line.label] / line.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = argv[++i];
    } else {
      device = "";
      break;
    }
  }
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "usage: bench_nn [--device cpu|cuda]\n");
    return 2;
  }
  try {
    return device == "cuda" ? bench_cuda() : bench_cpu();
  } catch (const std::exception& e) {  // a CUDA or BLAS failure: say what, not abort
    std::fprintf(stderr, "bench_nn: %s\n", e.what());
    return 1;
  }
}
