// 2-D convolution in NCHW: im2col + OpenBLAS GEMM, or Winograd F(2x2, 3x3) (conv2d_winograd.cpp) for the
// 3x3 stride-1 shapes where it is faster (conv2d_algorithm below says which).
// im2col: GEMMs over groups of images, OpenMP over the groups. A group
// is one image when its output plane is large; small planes (8x8 .. 14x14 digits) leave a GEMM too
// narrow for BLAS to run near peak, so several images share one GEMM of (c*r*s, group*p*q) columns. Each
// thread keeps its group's column matrix in its own reused buffer.
#include <algorithm>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "cblas.h"
#include "conv2d_internal.h"
#include "sparkgrad/common.h"
#include "sparkgrad/nn.h"

namespace sparkgrad::nn {

namespace {

// Reused per OpenMP thread: training calls conv2d every step with the same shapes. Slot 0 holds the
// column matrix, slot 1 a group's (k, group*p*q) output or output gradient, slot 2 an image's phase
// planes, slot 3 a group's output beside its output gradient (conv2d_forward_backward_weight).
template <typename T, int Slot>
T* workspace(std::int64_t size) {
  thread_local std::vector<T> buffer;
  if (static_cast<std::int64_t>(buffer.size()) < size) buffer.resize(static_cast<std::size_t>(size));
  return buffer.data();
}

// OpenBLAS has one process-wide thread count. While a conv2d call runs its own OpenMP team, BLAS is held
// at one thread so that each member's GEMM runs inline in that member, instead of asking for a nested
// team of workers (see common/blas.cpp) on cores that are already busy. Concurrent calls share the
// hold; the last one out restores the count.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holders_++ == 0) {
      saved_ = scipy_openblas_get_num_threads();
      if (saved_ != 1) scipy_openblas_set_num_threads(1);
    }
  }
  ~SingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--holders_ == 0 && saved_ != 1) scipy_openblas_set_num_threads(saved_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  static inline std::mutex mutex_;
  static inline int holders_ = 0;
  static inline int saved_ = 1;
};

// Images per GEMM: enough for about kGroupColumns output columns, but at most n / kMinGroups so that
// the batch still splits into groups for the threads. The grouping depends on the shape only, never on
// the thread count, so forward and input-gradient results do not change with the thread count.
constexpr std::int64_t kGroupColumns = 1024, kMinGroups = 8;
std::int64_t images_per_group(const Conv2dShape& g) {
  const std::int64_t wanted = std::max<std::int64_t>(1, kGroupColumns / std::max<std::int64_t>(1, g.p * g.q));
  return std::max<std::int64_t>(1, std::min(wanted, g.n / kMinGroups));
}

// fn(block, first, last, col) for each group of `group` consecutive images [first, last), the groups
// split into `blocks` contiguous runs that run in parallel (one run per call of fn's block); col is
// this thread's (c*r*s, group*p*q) buffer. Runs are handed out dynamically so a thread that is
// descheduled on a busy machine does not hold up the rest.
template <typename T, typename Fn>
void for_each_group(const Conv2dShape& g, std::int64_t group, std::int64_t blocks, Fn fn) {
  const std::int64_t groups = (g.n + group - 1) / group;
  const std::int64_t col_size = g.c * g.r * g.s * group * g.p * g.q;
  const bool parallel = blocks > 1 && max_threads() > 1;
  std::optional<SingleThreadedBlas> hold;
  if (parallel) hold.emplace();
  OmpExceptionGuard guard;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (std::int64_t block = 0; block < blocks; ++block) {
    guard.capture([&] {
      T* col = workspace<T, 0>(col_size);
      for (std::int64_t i = groups * block / blocks; i < groups * (block + 1) / blocks; ++i) {
        fn(block, i * group, std::min(g.n, (i + 1) * group), col);
      }
    });
  }
  guard.rethrow();
}

// Copies images [first, last) of a batch tensor (n, k, p*q) into a group's GEMM layout
// (k, (last - first) * p*q), where each image is a column block (ToGroup), or back.
template <bool ToGroup, typename T>
void regroup(const Conv2dShape& g, std::int64_t first, std::int64_t last, const T* from, T* to) {
  const std::int64_t pq = g.p * g.q, cols = (last - first) * pq;
  for (std::int64_t i = first; i < last; ++i) {
    for (std::int64_t kk = 0; kk < g.k; ++kk) {
      const std::int64_t batch_at = (i * g.k + kk) * pq, group_at = kk * cols + (i - first) * pq;
      const T* src = from + (ToGroup ? batch_at : group_at);
      std::copy(src, src + pq, to + (ToGroup ? group_at : batch_at));
    }
  }
}

// Output positions o in [lo, hi) read input position o * stride + offset inside [0, size).
void valid_range(std::int64_t offset, std::int64_t stride, std::int64_t size, std::int64_t out, std::int64_t* lo,
                 std::int64_t* hi) {
  const std::int64_t shift = -offset;  // o * stride >= shift  and  o * stride < size + shift
  *lo = shift <= 0 ? 0 : (shift + stride - 1) / stride;
  *hi = size + shift <= 0 ? 0 : std::min(out, (size + shift + stride - 1) / stride);
  *lo = std::min(*lo, *hi);
}

// Copies (ToColumns) or accumulates (col2im) `rows` x `cols` values between a strided image block and a
// strided column block. __restrict: the two never overlap, which lets short rows vectorize without
// runtime overlap checks.
template <bool ToColumns, typename ImagePtr, typename ColPtr>
void move_block(ImagePtr __restrict image, std::int64_t image_stride, ColPtr __restrict col, std::int64_t col_stride,
                std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i, image += image_stride, col += col_stride) {
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) {
      if constexpr (ToColumns) col[j] = image[j];
      else image[j] += col[j];
    }
  }
}

// Moves data between channel c of one image (h, w) and its im2col rows (c*r*s + r*s + s, columns
// [0, p*q) with row stride ld). ToColumns: image -> col, writing zeros for padding; otherwise col is
// accumulated into the image (col2im). In-bounds row and column ranges are computed once per (r, s);
// with stride 1 and no horizontal clipping the in-bounds rows form one strided block (move_block),
// which matters for LeNet's 8-wide output rows where per-row overhead would dominate.
template <bool ToColumns, typename ImagePtr, typename ColPtr>
void move_patches(const Conv2dShape& g, std::int64_t c, ImagePtr image, ColPtr col, std::int64_t ld) {
  using T = std::remove_const_t<std::remove_pointer_t<ColPtr>>;
  const std::int64_t q = g.q, w = g.w, stride_w = g.stride_w;
  for (std::int64_t r = 0; r < g.r; ++r) {
    std::int64_t row_lo, row_hi;  // output rows whose input row oh * stride_h - pad_top + r is inside
    valid_range(r - g.pad_top, g.stride_h, g.h, g.p, &row_lo, &row_hi);
    for (std::int64_t s = 0; s < g.s; ++s) {
      std::int64_t lo, hi;
      valid_range(s - g.pad_left, stride_w, w, q, &lo, &hi);
      const std::int64_t offset = s - g.pad_left;
      ColPtr col_rows = col + ((c * g.r + r) * g.s + s) * ld;
      if constexpr (ToColumns) {
        std::fill(col_rows, col_rows + row_lo * q, T(0));
        std::fill(col_rows + row_hi * q, col_rows + g.p * q, T(0));
      }
      auto in_row = [&](std::int64_t oh) { return image + (c * g.h + oh * g.stride_h - g.pad_top + r) * w; };
      if constexpr (ToColumns) {
        if (g.stride_h == 1 && stride_w == 1 && q == w && row_hi > row_lo && hi > lo) {
          // Stride 1 and output rows as wide as input rows ("same"): column j of this row reads image
          // element j + constant, so the in-bounds run is one long copy (rows of 8-28 values would
          // each pay loop overhead); the columns that wrapped into a neighbouring input row are zeroed.
          const T* base = in_row(row_lo) + offset - row_lo * q;
          std::copy(base + row_lo * q + lo, base + (row_hi - 1) * q + hi, col_rows + row_lo * q + lo);
          for (std::int64_t oh = row_lo; oh < row_hi; ++oh) {
            std::fill(col_rows + oh * q, col_rows + oh * q + lo, T(0));
            std::fill(col_rows + oh * q + hi, col_rows + (oh + 1) * q, T(0));
          }
          continue;
        }
      }
      if (stride_w == 1 && lo == 0 && hi == q && row_hi > row_lo) {
        move_block<ToColumns>(in_row(row_lo) + offset, g.stride_h * w, col_rows + row_lo * q, q, row_hi - row_lo,
                              q);
        continue;
      }
      for (std::int64_t oh = row_lo; oh < row_hi; ++oh) {
        ColPtr col_row = col_rows + oh * q;
        ImagePtr in = in_row(oh);
        if constexpr (ToColumns) {
          std::fill(col_row, col_row + lo, T(0));
          std::fill(col_row + hi, col_row + q, T(0));
        }
        for (std::int64_t ow = lo; ow < hi; ++ow) {
          if constexpr (ToColumns) col_row[ow] = in[ow * stride_w + offset];
          else in[ow * stride_w + offset] += col_row[ow];
        }
      }
    }
  }
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// A strided convolution whose kernel covers every phase of its stride (r >= stride_h, s >= stride_w,
// as in a stride-2 4x4 deconvolution) moves its patches through the image split into its stride_h x
// stride_w phases, each a plane with a zero border wide enough for every tap: tap (r, s) is then
// output (oh, ow) <- plane element (oh + u, ow + v) of one phase, a p x q block copy without bounds
// checks or padding fills, where the strided path gathered element by element and filled zeros row by
// row. The values moved, and for col2im their order of accumulation, are those of the strided path.
// Measured on the stride-2 4x4 deconvolution of 16 channels 28x28 <-> 32 channels 14x14, 64 images, one
// thread: 3.6 -> 2.8 ms for the forward pass (im2col), 4.1 -> 3.3 for the weight gradient, with the
// memmove calls of short rows gone (cpp/CMakeLists.txt).
struct Phases {
  std::int64_t u_min, v_min;  // the smallest tap shifts: plane row i holds phase row i + u_min
  std::int64_t rows, cols;    // of each plane: p + u_max - u_min, q + v_max - v_min
  std::int64_t size;          // c * stride_h * stride_w * rows * cols
};
std::optional<Phases> phases_of(const Conv2dShape& g) {
  if ((g.stride_h == 1 && g.stride_w == 1) || g.r < g.stride_h || g.s < g.stride_w) return std::nullopt;
  Phases ph;
  ph.u_min = floor_div(-g.pad_top, g.stride_h);
  ph.v_min = floor_div(-g.pad_left, g.stride_w);
  ph.rows = g.p + floor_div(g.r - 1 - g.pad_top, g.stride_h) - ph.u_min;
  ph.cols = g.q + floor_div(g.s - 1 - g.pad_left, g.stride_w) - ph.v_min;
  ph.size = g.c * g.stride_h * g.stride_w * ph.rows * ph.cols;
  return ph;
}

// fn(plane offset, col row) for each tap (c, r, s): the tap's block starts at that offset of the planes.
template <typename Fn>
void for_each_phase_tap(const Conv2dShape& g, const Phases& ph, Fn fn) {
  for (std::int64_t c = 0; c < g.c; ++c) {
    for (std::int64_t r = 0; r < g.r; ++r) {
      const std::int64_t u = floor_div(r - g.pad_top, g.stride_h), a = r - g.pad_top - u * g.stride_h;
      for (std::int64_t s = 0; s < g.s; ++s) {
        const std::int64_t v = floor_div(s - g.pad_left, g.stride_w), b = s - g.pad_left - v * g.stride_w;
        const std::int64_t plane = ((c * g.stride_h + a) * g.stride_w + b) * ph.rows * ph.cols;
        fn(plane + (u - ph.u_min) * ph.cols + (v - ph.v_min), (c * g.r + r) * g.s + s);
      }
    }
  }
}

// to[j * to_stride] = from[j * from_stride] for j < n; stride 2 (the common deconvolution) with the
// stride known to the compiler, so that it vectorizes.
template <typename T>
void strided_copy(const T* __restrict from, std::int64_t from_stride, T* __restrict to, std::int64_t to_stride,
                  std::int64_t n) {
  if (from_stride == 2 && to_stride == 1) {
    for (std::int64_t j = 0; j < n; ++j) to[j] = from[2 * j];
  } else if (from_stride == 1 && to_stride == 2) {
    for (std::int64_t j = 0; j < n; ++j) to[2 * j] = from[j];
  } else {
    for (std::int64_t j = 0; j < n; ++j) to[j * to_stride] = from[j * from_stride];
  }
}

// image (c, h, w) <-> phase planes (c, stride_h, stride_w, rows, cols): plane (a, b) element (i, j) is
// image element ((i + u_min) * stride_h + a, (j + v_min) * stride_w + b), zero outside the image. Split
// fills the planes; otherwise the image is written from them, zero where no plane holds it.
template <bool Split, typename T>
void move_phases(const Conv2dShape& g, const Phases& ph, const T* from, T* to) {
  const std::int64_t sh = g.stride_h, sw = g.stride_w;
  if constexpr (!Split) std::fill(to, to + g.c * g.h * g.w, T(0));
  for (std::int64_t c = 0; c < g.c; ++c) {
    for (std::int64_t a = 0; a < sh; ++a) {
      for (std::int64_t b = 0; b < sw; ++b) {
        std::int64_t lo, hi;  // plane columns inside the image
        valid_range(ph.v_min * sw + b, sw, g.w, ph.cols, &lo, &hi);
        const std::int64_t plane = ((c * sh + a) * sw + b) * ph.rows * ph.cols;
        for (std::int64_t i = 0; i < ph.rows; ++i) {
          const std::int64_t y = (i + ph.u_min) * sh + a;
          const bool inside = y >= 0 && y < g.h && hi > lo;
          T* plane_row = (Split ? to : const_cast<T*>(from)) + plane + i * ph.cols;
          if constexpr (Split) {
            if (!inside) {
              std::fill(plane_row, plane_row + ph.cols, T(0));
              continue;
            }
            const T* image_row = from + (c * g.h + y) * g.w + (ph.v_min + lo) * sw + b;
            std::fill(plane_row, plane_row + lo, T(0));
            strided_copy(image_row, sw, plane_row + lo, 1, hi - lo);
            std::fill(plane_row + hi, plane_row + ph.cols, T(0));
          } else if (inside) {
            strided_copy(plane_row + lo, 1, to + (c * g.h + y) * g.w + (ph.v_min + lo) * sw + b, sw, hi - lo);
          }
        }
      }
    }
  }
}

// x_image: (c, h, w) -> col: (c*r*s, p*q) with row stride ld, or col accumulated into dx_image
// (zeroed here). The phase planes live in this thread's workspace slot 2.
template <typename T>
void im2col(const Conv2dShape& g, const T* x_image, T* col, std::int64_t ld) {
  if (const std::optional<Phases> ph = phases_of(g)) {
    T* planes = workspace<T, 2>(ph->size);
    move_phases<true>(g, *ph, x_image, planes);
    for_each_phase_tap(g, *ph, [&](std::int64_t at, std::int64_t row) {
      move_block<true>(planes + at, ph->cols, col + row * ld, g.q, g.p, g.q);
    });
    return;
  }
  for (std::int64_t c = 0; c < g.c; ++c) move_patches<true>(g, c, x_image, col, ld);
}
template <typename T>
void col2im(const Conv2dShape& g, const T* col, std::int64_t ld, T* dx_image) {
  if (const std::optional<Phases> ph = phases_of(g)) {
    T* planes = workspace<T, 2>(ph->size);
    std::fill(planes, planes + ph->size, T(0));
    for_each_phase_tap(g, *ph, [&](std::int64_t at, std::int64_t row) {
      move_block<false>(planes + at, ph->cols, col + row * ld, g.q, g.p, g.q);
    });
    move_phases<false>(g, *ph, planes, dx_image);
    return;
  }
  std::fill(dx_image, dx_image + g.c * g.h * g.w, T(0));
  for (std::int64_t c = 0; c < g.c; ++c) move_patches<false>(g, c, dx_image, col, ld);
}

}  // namespace

ConvAlgorithm parse_conv_algorithm(const char* op, const std::string& name) {
  if (name == "auto") return ConvAlgorithm::Auto;
  if (name == "im2col") return ConvAlgorithm::Im2col;
  if (name == "winograd") return ConvAlgorithm::Winograd;
  if (name == "cudnn") return ConvAlgorithm::Cudnn;
  throw_invalid(op, "unknown algorithm '", name, "', expected one of auto im2col winograd cudnn");
}

bool conv2d_winograd_applies(const Conv2dShape& g) {
  return g.r == 3 && g.s == 3 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top <= 2 && g.pad_left <= 2;
}

// Auto: Winograd where it applies and both channel counts are at least kWinogradMinChannels. Below that
// each transformed tile feeds too few multiply-adds to pay for its transforms. Measured per pass with
// 64 images on the development machine (AVX-512, one thread): at 8 channels (28x28) im2col took 0.99,
// 0.98, 1.01 ms (forward, input gradient, weight gradient) against Winograd's 1.46, 1.32, 1.16; at 16
// channels Winograd took 3.2, 3.3, 2.9 ms against 3.3, 3.5, 4.1, and at 32 (14x14) 2.0, 2.0, 2.3 against
// 3.1, 3.1, 3.5.
constexpr std::int64_t kWinogradMinChannels = 16;
ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape& g, ConvAlgorithm requested) {
  if (requested == ConvAlgorithm::Cudnn) {
    throw_invalid(op, "algorithm 'cudnn' runs on a GPU only, use auto, im2col or winograd on the CPU");
  }
  const bool applies = conv2d_winograd_applies(g);
  if (requested == ConvAlgorithm::Winograd && !applies) {
    throw_invalid(op, "algorithm 'winograd' needs 3x3 kernels, stride 1 and padding <= 2, got ", g.r, "x", g.s,
                  " kernels, stride ", g.stride_h, "x", g.stride_w, ", padding ", g.pad_top, ",", g.pad_left);
  }
  if (requested != ConvAlgorithm::Auto) return requested;
  return applies && g.c >= kWinogradMinChannels && g.k >= kWinogradMinChannels ? ConvAlgorithm::Winograd
                                                                                 : ConvAlgorithm::Im2col;
}

namespace {

// relu(y) over n values, in place.
template <typename T>
void clamp_at_zero(T* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = y[i] > T(0) ? y[i] : T(0);
}

}  // namespace

// x: (n, c, h, w), weights: (k, c*r*s), b: (k) or null -> y: (n, k, p, q). im2col, per group of images:
// y_group (k, group*p*q) = weights @ col_group (c*r*s, group*p*q) + b, then relu while the group is hot.
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y, bool relu,
                    ConvAlgorithm algorithm) {
  if (conv2d_algorithm("conv2d_forward", g, algorithm) == ConvAlgorithm::Winograd) {
    detail::winograd_forward(g, x, weights, b, relu, y);
    return;
  }
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const std::int64_t group = images_per_group(g), groups = (g.n + group - 1) / group;
  for_each_group<T>(g, group, groups, [&](std::int64_t, std::int64_t first, std::int64_t last, T* col) {
    const std::int64_t cols = (last - first) * pq;
    T* out = group == 1 ? y + first * g.k * pq : workspace<T, 1>(g.k * cols);
    for (std::int64_t i = first; i < last; ++i) im2col(g, x + i * chw, col + (i - first) * pq, cols);
    gemm_in_small_pieces<T>(Transpose::No, Transpose::No, g.k, cols, crs, T(1), weights, crs, col, cols, T(0),
                            out, cols);
    if (b) bias_add(out, b, 1, g.k, cols);
    if (relu) clamp_at_zero(out, g.k * cols);
    if (group > 1) regroup<false>(g, first, last, out, y);
  });
}

// dy: (n, k, p, q), weights: (k, c*r*s), b: (c) or null -> dx: (n, c, h, w) + b, then relu. Strided: per
// group, col = weights^T @ dy_group, col2im per image, the bias and relu while the image is hot.
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, const T* b, T* dx, bool relu,
                           ConvAlgorithm algorithm) {
  const ConvAlgorithm chosen = conv2d_algorithm("conv2d_backward_input", g, algorithm);
  if (chosen == ConvAlgorithm::Winograd ||
      (g.stride_h == 1 && g.stride_w == 1 && g.pad_top < g.r && g.pad_left < g.s && g.k <= g.c)) {
    // With stride 1, dx is the forward convolution of dy with the kernel flipped in space and transposed
    // in channels, over r - 1 - pad of padding: its GEMM reduces over k*r*s (the forward's shape)
    // instead of over k alone, and no col2im scatter is needed. It gathers k*r*s rows where col2im
    // scatters c*r*s, so it pays when k <= c (measured: 12% faster at k = c = 32, 48% slower at
    // k = 32, c = 16). Winograd computes dx this way whatever k and c are.
    std::vector<T> flipped(static_cast<std::size_t>(g.k * g.c * g.r * g.s));
    for (std::int64_t kk = 0; kk < g.k; ++kk) {
      for (std::int64_t cc = 0; cc < g.c; ++cc) {
        for (std::int64_t rr = 0; rr < g.r; ++rr) {
          for (std::int64_t ss = 0; ss < g.s; ++ss) {
            flipped[((cc * g.k + kk) * g.r + g.r - 1 - rr) * g.s + g.s - 1 - ss] =
                weights[((kk * g.c + cc) * g.r + rr) * g.s + ss];
          }
        }
      }
    }
    const Conv2dShape full{g.n, g.k, g.p, g.q, g.c, g.r, g.s, g.h, g.w, 1, 1, g.r - 1 - g.pad_top,
                           g.s - 1 - g.pad_left};
    conv2d_forward<T>(full, dy, flipped.data(), b, dx, relu, chosen);
    return;
  }
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w;
  const std::int64_t group = images_per_group(g), groups = (g.n + group - 1) / group;
  for_each_group<T>(g, group, groups, [&](std::int64_t, std::int64_t first, std::int64_t last, T* col) {
    const std::int64_t cols = (last - first) * pq;
    const T* grad = dy + first * g.k * pq;
    if (group > 1) {
      T* grouped = workspace<T, 1>(g.k * cols);
      regroup<true>(g, first, last, dy, grouped);
      grad = grouped;
    }
    gemm_in_small_pieces<T>(Transpose::Yes, Transpose::No, crs, cols, g.k, T(1), weights, crs, grad, cols, T(0),
                            col, cols);
    for (std::int64_t i = first; i < last; ++i) {
      T* image = dx + i * chw;
      col2im(g, col + (i - first) * pq, cols, image);
      if (b) bias_add(image, b, 1, g.c, g.h * g.w);
      if (relu) clamp_at_zero(image, chw);
    }
  });
}

namespace {

// Partials of the im2col weight gradient: a fixed number, not the thread count, so that its result does
// not depend on the thread count (as Winograd's kWeightRuns).
constexpr std::int64_t kWeightRuns = 8;

// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c*r*s) = sum over groups of dy_group @ col_group^T, and
// with weights and y (else null) also y: (n, k, p, q) = conv(x, weights) from the same im2col. The groups
// split into kWeightRuns runs; each run sums into its own partial and the partials are added in run
// order, so the result depends neither on which thread ran which run nor on the thread count. y is
// computed per group exactly as conv2d_forward computes it. The partials hold dw transposed, col_group @
// dy_group^T: OpenBLAS runs that orientation (the long c*r*s side first) at 81-93 GFLOP/s where dy @ col^T
// ran at 65-80 on the development machine (16 and 32 channels, 3x3 kernels).
template <typename T>
void weight_grad_im2col(const Conv2dShape& g, const T* x, const T* dy, T* dw, const T* weights, T* y) {
  const std::int64_t crs = g.c * g.r * g.s, pq = g.p * g.q, chw = g.c * g.h * g.w, size = g.k * crs;
  const std::int64_t group = images_per_group(g), groups = (g.n + group - 1) / group;
  const std::int64_t runs = std::min(groups, kWeightRuns);
  std::vector<T> partial(static_cast<std::size_t>(runs * size), T(0));
  for_each_group<T>(g, group, runs, [&](std::int64_t run, std::int64_t first, std::int64_t last, T* col) {
    const std::int64_t cols = (last - first) * pq;
    for (std::int64_t i = first; i < last; ++i) im2col(g, x + i * chw, col + (i - first) * pq, cols);
    if (y) {
      T* out = group == 1 ? y + first * g.k * pq : workspace<T, 3>(g.k * cols);
      gemm_in_small_pieces<T>(Transpose::No, Transpose::No, g.k, cols, crs, T(1), weights, crs, col, cols, T(0),
                              out, cols);
      if (group > 1) regroup<false>(g, first, last, out, y);
    }
    const T* grad = dy + first * g.k * pq;
    if (group > 1) {
      T* grouped = workspace<T, 1>(g.k * cols);
      regroup<true>(g, first, last, dy, grouped);
      grad = grouped;
    }
    gemm<T>(Transpose::No, Transpose::Yes, crs, g.k, cols, T(1), col, cols, grad, cols, T(1),
            partial.data() + run * size, g.k);
  });
  if (runs == 0) {  // no images
    std::fill(dw, dw + size, T(0));
    return;
  }
  for (std::int64_t run = 1; run < runs; ++run) {
    const T* part = partial.data() + run * size;
    for (std::int64_t e = 0; e < size; ++e) partial[e] += part[e];
  }
  for (std::int64_t kk = 0; kk < g.k; ++kk) {
    for (std::int64_t i = 0; i < crs; ++i) dw[kk * crs + i] = partial[i * g.k + kk];
  }
}

}  // namespace

template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw, ConvAlgorithm algorithm) {
  if (conv2d_algorithm("conv2d_backward_weight", g, algorithm) == ConvAlgorithm::Winograd) {
    detail::winograd_backward_weight(g, x, dy, dw);
    return;
  }
  weight_grad_im2col<T>(g, x, dy, dw, nullptr, nullptr);
}

// One im2col of x for both passes (im2col); Winograd transforms x for each.
template <typename T>
void conv2d_forward_backward_weight(const Conv2dShape& g, const T* x, const T* weights, const T* dy, T* y, T* dw,
                                    ConvAlgorithm algorithm) {
  if (conv2d_algorithm("conv2d_forward_backward_weight", g, algorithm) == ConvAlgorithm::Winograd) {
    detail::winograd_backward_weight(g, x, dy, dw);
    if (y) detail::winograd_forward<T>(g, x, weights, nullptr, false, y);
    return;
  }
  weight_grad_im2col<T>(g, x, dy, dw, weights, y);
}

#define SPARKGRAD_CONV2D(T)                                                                            \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm); \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, const T*, T*, bool, ConvAlgorithm); \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*, ConvAlgorithm);          \
  template void conv2d_forward_backward_weight<T>(const Conv2dShape&, const T*, const T*, const T*, T*, T*,    \
                                                  ConvAlgorithm);
SPARKGRAD_CONV2D(float)
SPARKGRAD_CONV2D(double)

}  // namespace sparkgrad::nn
