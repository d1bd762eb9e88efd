// Threshold-encoding throughput next to a copy of the same vector, measured in the same run.
// Usage: bench_compress [n=16777216] [repetitions=5]
// For 1 thread and all threads: copy (baseline), sparse encode at densities 1e-4..1e-1, sparse decode,
// bitmap encode and bitmap decode of a float32 vector; each time is the minimum over the repetitions.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "sparkgrad/common.h"
#include "sparkgrad/compress.h"

using namespace sparkgrad;
using namespace sparkgrad::compress;

namespace {

using Clock = std::chrono::steady_clock;

// Minimum over `reps` of the seconds fn() takes; prepare() runs untimed before each repetition.
template <typename Prepare, typename Fn>
double min_seconds(int reps, Prepare&& prepare, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    prepare();
    const auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// The baseline: a copy split over the current OpenMP threads (memcpy per thread).
void parallel_copy(const float* src, float* dst, std::int64_t n) {
#pragma omp parallel
  {
    const std::int64_t threads = omp_get_num_threads();
    const std::int64_t id = omp_get_thread_num();
    const std::int64_t begin = n * id / threads;
    const std::int64_t end = n * (id + 1) / threads;
    std::memcpy(dst + begin, src + begin, sizeof(float) * static_cast<std::size_t>(end - begin));
  }
}

// |x| < t everywhere except a `density` fraction of elements at +-2t (t = 1).
std::vector<float> make_residual(std::int64_t n, double density, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> small(-0.99f, 0.99f);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = coin(rng) < density ? (coin(rng) < 0.5 ? -2.0f : 2.0f) : small(rng);
  return x;
}

void report(const char* op, int threads, const char* detail, double seconds, std::int64_t n, double copy) {
  std::printf("%-15s threads=%d %-14s %9.3f ms %7.3f ns/param %7.2f GB/s  %5.2fx copy\n", op, threads, detail,
              seconds * 1e3, seconds * 1e9 / static_cast<double>(n),
              static_cast<double>(n) * sizeof(float) / seconds / 1e9, seconds / copy);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : (std::int64_t{1} << 24);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int all = omp_get_num_procs();
  std::printf("bench_compress: n=%lld float32 (%.0f MB), repetitions=%d (min), threads 1 and %d\n",
              static_cast<long long>(n), n * 4 / 1e6, reps, all);
  std::vector<float> work(static_cast<std::size_t>(n)), target(static_cast<std::size_t>(n));
  const auto restore = [&](const std::vector<float>& src) {
    return [&] { std::memcpy(work.data(), src.data(), sizeof(float) * src.size()); };
  };
  for (const int threads : {1, all}) {
    set_num_threads(threads);
    const std::vector<float> base = make_residual(n, 1e-3, 1);
    const double copy = min_seconds(reps, [] {}, [&] { parallel_copy(base.data(), target.data(), n); });
    report("copy", threads, "", copy, n, copy);
    for (const double density : {1e-4, 1e-3, 1e-2, 1e-1}) {
      const std::vector<float> src = make_residual(n, density, 2);
      std::vector<std::int32_t> message;
      const double enc = min_seconds(reps, restore(src), [&] {
        const SparsePlan plan = threshold_plan(work.data(), n, 1.0, -1);
        message.resize(static_cast<std::size_t>(kHeaderWords + plan.entries));
        threshold_encode(work.data(), plan, message.data());
      });
      char detail[32];
      std::snprintf(detail, sizeof detail, "density=%g", density);
      report("sparse encode", threads, detail, enc, n, copy);
      const double dec = min_seconds(
          reps, [] {},
          [&] { decode("decode", message.data(), static_cast<std::int64_t>(message.size()), target.data(), n, kFlagAny); });
      report("sparse decode", threads, detail, dec, n, copy);
    }
    const std::vector<float> src = make_residual(n, 1e-2, 3);
    std::vector<std::int32_t> bitmap(static_cast<std::size_t>(bitmap_length(n)));
    const double benc = min_seconds(reps, restore(src), [&] { bitmap_encode(work.data(), n, 1.0, bitmap.data()); });
    report("bitmap encode", threads, "density=0.01", benc, n, copy);
    const double bdec = min_seconds(
        reps, [] {}, [&] { decode("decode", bitmap.data(), bitmap_length(n), target.data(), n, kFlagAny); });
    report("bitmap decode", threads, "density=0.01", bdec, n, copy);
  }
  return 0;
}
