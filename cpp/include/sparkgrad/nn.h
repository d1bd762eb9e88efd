// Neural-network kernels (CPU, OpenMP). Every kernel takes raw row-major buffers plus their sizes and
// writes caller-allocated outputs (overwritten unless "accumulates" is stated). Kernels never divide by
// the batch size. The CUDA twins (cuda/nn/<same stem>.cu) implement these declarations in
// sparkgrad::nn::cuda. Each kernel has one front door, its binding in python/bindings/nn.cpp: it checks
// the arguments once, host or device arrays alike, and calls the twin of the arrays' device.
#pragma once

#include <cstdint>
#include <string>

namespace sparkgrad::nn {

// ---- dense helpers (cpp/src/nn/bias.cpp) ---------------------------------------------------------
// x: (n, c, inner) with inner = H*W (1 for dense); b: (c). x[i, j, :] += b[j].
template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner);
// dy: (n, c, inner); db: (c) = sum of dy over axes 0 and 2.
template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner);

// ---- layout (cpp/src/nn/layout.cpp) ---------------------------------------------------------------
// y: (n, cols, rows) = x: (n, rows, cols) with its last two axes swapped: a sequence's (N, T, C) as the
// (N, C, T) planes the 2-D kernels read and back (the 1-D convolution and pooling layers). x, y distinct.
template <typename T>
void swap_last_axes(const T* x, T* y, std::int64_t n, std::int64_t rows, std::int64_t cols);

// ---- activations (cpp/src/nn/activation.cpp) ------------------------------------------------------
enum class Activation : std::uint8_t { Identity, Relu, LeakyRelu, Elu, Tanh, Sigmoid, Softmax, Softplus, HardTanh };
// Parses the lower-case name; throws std::invalid_argument "[op] unknown activation ..." otherwise.
Activation parse_activation(const char* op, const std::string& name);

// x, y: (rows, cols); elementwise kinds treat them as rows*cols values, softmax works per row.
// alpha: leakyrelu slope / elu alpha. y may alias x.
template <typename T>
void activation_forward(Activation kind, double alpha, const T* x, T* y, std::int64_t rows, std::int64_t cols);
// x: pre-activation, y = f(x), dy = dL/dy, dx = dL/dx; all (rows, cols). dx may alias dy.
template <typename T>
void activation_backward(Activation kind, double alpha, const T* x, const T* y, const T* dy, T* dx,
                         std::int64_t rows, std::int64_t cols);

// ---- losses (cpp/src/nn/loss.cpp) -----------------------------------------------------------------
enum class Loss : std::uint8_t { Mcxent, NegativeLogLikelihood, Mse, L1, L2, Xent, Hinge, SquaredHinge, KlDivergence };
Loss parse_loss(const char* op, const std::string& name);

// How a loss mask is laid out: none, one weight per example (n), or one per output (n, c).
enum class MaskLayout : std::uint8_t { None, PerExample, PerOutput };

struct LossSpec {
  Loss loss;
  Activation activation;  // the output activation: p = activation(preout)
  double alpha;           // its alpha (leakyrelu / elu)
};

// labels, preout: (n, c); mask: null, (n) or (n, c) per `layout`; scores: (n) = per-example loss summed
// over columns, times the mask.
template <typename T>
void loss_score(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                T* scores, std::int64_t n, std::int64_t c);
// grad: (n, c) = d(example loss)/d(preout), times the mask.
template <typename T>
void loss_gradient(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                   T* grad, std::int64_t n, std::int64_t c);

// ---- convolution (cpp/src/nn/conv2d.cpp) ----------------------------------------------------------
// x: (n, c, h, w), weights: (k, c, r, s), y: (n, k, p, q). Input positions outside [0, h) x [0, w)
// read as zero, so top/left padding plus the output size express both "truncate" and "same" modes.
struct Conv2dShape {
  std::int64_t n, c, h, w;  // input
  std::int64_t k, r, s;     // output channels, kernel height, kernel width
  std::int64_t p, q;        // output height, width
  std::int64_t stride_h, stride_w, pad_top, pad_left;
};
// How a convolution is computed: im2col + GEMM, Winograd F(2x2, 3x3) (3x3 kernels, stride 1, padding
// <= 2; CPU only) or cuDNN (GPU only, in a build that found cuDNN). Auto picks per shape by the rule
// measured in conv2d.cpp on the CPU, and cuDNN where it was built on the GPU.
enum class ConvAlgorithm : std::uint8_t { Auto, Im2col, Winograd, Cudnn };
// Parses "auto", "im2col", "winograd" or "cudnn"; throws std::invalid_argument "[op] ..." otherwise.
ConvAlgorithm parse_conv_algorithm(const char* op, const std::string& name);
bool conv2d_winograd_applies(const Conv2dShape& g);
// What `requested` runs as for g (never Auto); throws "[op] ..." for Winograd on a shape it cannot compute.
ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape& g, ConvAlgorithm requested);
// b: (k) or null. relu: y = max(conv + b, 0), fused into the pass that writes y.
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y, bool relu = false,
                    ConvAlgorithm algorithm = ConvAlgorithm::Auto);
// dy: (n, k, p, q) -> dx: (n, c, h, w); b: (c) or null. relu: dx = max(dx + b, 0), fused into the pass
// that writes dx (the epilogue of a transposed convolution's forward, which this is).
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, const T* b, T* dx, bool relu = false,
                           ConvAlgorithm algorithm = ConvAlgorithm::Auto);
// x: (n, c, h, w), dy: (n, k, p, q) -> dw: (k, c, r, s).
template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw,
                            ConvAlgorithm algorithm = ConvAlgorithm::Auto);
// Both conv2d_forward (no bias, no relu; y may be null: dw only) and conv2d_backward_weight from one im2col of
// x: a transposed convolution's (Deconvolution2D's) backward, whose dL/dx and dL/dW both read dL/dy as x.
// x: (n, c, h, w), weights: (k, c, r, s), dy: (n, k, p, q) -> y: (n, k, p, q), dw: (k, c, r, s); the same
// results as the two calls.
template <typename T>
void conv2d_forward_backward_weight(const Conv2dShape& g, const T* x, const T* weights, const T* dy, T* y, T* dw,
                                    ConvAlgorithm algorithm = ConvAlgorithm::Auto);

// ---- pooling (cpp/src/nn/pool2d.cpp) --------------------------------------------------------------
enum class PoolKind : std::uint8_t { Max, Avg, Sum };
PoolKind parse_pool_kind(const char* op, const std::string& name, bool allow_sum);

// x: (n, c, h, w), y: (n, c, p, q); argmax: (n, c, p, q) flat index into each (h, w) plane, written for
// Max (may be null otherwise). Avg divides by the number of in-bounds window elements. Every window
// must hold at least one in-bounds element (checked by the caller).
struct Pool2dShape {
  std::int64_t n, c, h, w, p, q;
  std::int64_t kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left;
};
template <typename T>
void pool2d_forward(PoolKind kind, const Pool2dShape& g, const T* x, T* y, std::int64_t* argmax);
// dy: (n, c, p, q) -> dx: (n, c, h, w); argmax as written by pool2d_forward for Max.
template <typename T>
void pool2d_backward(PoolKind kind, const Pool2dShape& g, const T* dy, T* dx, const std::int64_t* argmax);

// x: (planes, size) -> y: (planes); argmax: (planes) for Max.
template <typename T>
void global_pool_forward(PoolKind kind, const T* x, T* y, std::int64_t* argmax, std::int64_t planes,
                         std::int64_t size);
// dy: (planes) -> dx: (planes, size).
template <typename T>
void global_pool_backward(PoolKind kind, const T* dy, T* dx, const std::int64_t* argmax, std::int64_t planes,
                          std::int64_t size);

// ---- batch normalization (cpp/src/nn/batchnorm.cpp) -----------------------------------------------
// x, y, dy, dx: (n, c, inner) with inner = H*W (1 for dense); gamma, beta, means, variances, dgamma,
// dbeta: (c). Statistics are per channel over n*inner values; variances are biased.
struct BatchNormShape {
  std::int64_t n, c, inner;
};
// Writes batch_mean/batch_var and updates running = decay * running + (1 - decay) * batch.
template <typename T>
void batchnorm_forward_train(const BatchNormShape& g, const T* x, const T* gamma, const T* beta, T* y,
                             T* batch_mean, T* batch_var, T* running_mean, T* running_var, double decay,
                             double eps);
template <typename T>
void batchnorm_forward_inference(const BatchNormShape& g, const T* x, const T* gamma, const T* beta,
                                 const T* running_mean, const T* running_var, T* y, double eps);
template <typename T>
void batchnorm_backward(const BatchNormShape& g, const T* x, const T* dy, const T* gamma, const T* batch_mean,
                        const T* batch_var, T* dx, T* dgamma, T* dbeta, double eps);

// ---- layer normalization (cpp/src/nn/layer_norm.cpp) --------------------------------------------
// x, y, dy, dx: (rows, c); gain, dgain: (c); bias, dbias: (c) or null (no bias); mean, rstd: (rows).
// Each row is normalized over its c values: y = (x - mean) * rstd * gain + bias with the biased variance,
// rstd = 1 / sqrt(var + eps) (statistics accumulate in double).
template <typename T>
void layer_norm_forward(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t c, double eps);
// Backward of layer_norm_forward given its mean and rstd: dx = rstd (g - mean(g) - xhat mean(g xhat)) with
// g = dy gain, xhat = (x - mean) rstd; dgain = sum over rows of dy xhat, dbias = sum of dy. The sums over
// rows add fixed blocks of rows in order: the same bits for any thread count. dx may alias dy.
template <typename T>
void layer_norm_backward(const T* x, const T* dy, const T* gain, const T* mean, const T* rstd, T* dx, T* dgain,
                         T* dbias, std::int64_t rows, std::int64_t c);

// ---- multi-head dot-product attention (cpp/src/nn/attention.cpp) ----------------------------------
// For each example b and head j: weights = masked_softmax(scale q_bj k_bj^T) over the keys, y_bj =
// weights v_bj. A key whose mask value is 0 gets weight exactly 0 (a query with no present key gets all
// zero weights and outputs zero). Heads are interleaved in the feature axis, as a projection's output
// leaves them: q: (n, tq, heads * d), k: (n, tk, heads * d), v: (n, tk, heads * dv), y: (n, tq, heads * dv);
// weights: (n, heads, tq, tk); mask: (n, tk) or null (every key present).
struct AttentionShape {
  std::int64_t n, heads, tq, tk, d, dv;
};
template <typename T>
void attention_forward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* mask, double scale,
                       T* weights, T* y);
// Backward of attention_forward given its weights and dy = dL/dy: (n, tq, heads * dv). dweights: (n, heads,
// tq, tk) scratch; writes dq, dk, dv shaped as q, k, v. Every (example, head) is one thread's: the same bits
// for any thread count.
template <typename T>
void attention_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* weights, const T* dy,
                        double scale, T* dweights, T* dq, T* dk, T* dv);

// ---- embedding lookup (cpp/src/nn/embedding.cpp) ------------------------------------------------
// indices: (n) rows of w: (vocab, dim); y, dy: (n, dim); dw: (vocab, dim). Both kernels first check every
// index: first_bad (2 values on the host) gets the position of the first one outside [0, vocab) and that
// index, and then nothing is written; or {-1, 0}.
// y[i] = w[indices[i]].
template <typename T>
void embedding_forward(const std::int64_t* indices, const T* w, T* y, std::int64_t n, std::int64_t vocab,
                       std::int64_t dim, std::int64_t* first_bad);
// dw[indices[i]] += dy[i], accumulated (rows no index names are left as they are). Every row's sum runs
// over its positions in ascending order, whatever the thread count: the result is deterministic.
template <typename T>
void embedding_backward(const std::int64_t* indices, const T* dy, T* dw, std::int64_t n, std::int64_t vocab,
                        std::int64_t dim, std::int64_t* first_bad);

// ---- inverted dropout (cpp/src/nn/dropout.cpp) ----------------------------------------------------
// x, y, mask: (size). mask[i] = 1/retain with probability retain, else 0, drawn from a counter-based
// generator of (seed, i): the result does not depend on the thread count. y = x * mask (y may alias x).
template <typename T>
void dropout_forward(const T* x, T* y, T* mask, std::int64_t size, double retain, std::uint64_t seed);
// dy, mask, dx: (size); dx = dy * mask (dx may alias dy).
template <typename T>
void dropout_backward(const T* dy, const T* mask, T* dx, std::int64_t size);

// ---- LSTM over a whole sequence (cpp/src/nn/lstm.cpp) ----------------------------------------------
// DL4J's LSTM without peepholes. Gate blocks of the 4h pre-activations, in DL4J's order: [block input
// a (activation), forget f, output o, input gate i (gate activation)]; c = f c_prev + i a,
// h = o activation(c). A mask value m at (example, step) multiplies that step's h and c (0: the step
// outputs zero and the next step starts from a zero state, as DL4J does).
struct LstmShape {
  std::int64_t n, t, c, h;  // examples, time steps, input size, hidden size
};
struct LstmSpec {
  Activation activation;  // block input and cell output (DL4J default tanh); elementwise kinds only
  double alpha;
  Activation gate;  // forget, output and input gates (DL4J default sigmoid); elementwise kinds only
  double gate_alpha;
};
// The spec of the named activations (also the GRU's); throws "[op] ..." (ValueError) for an unknown name or
// softmax, which is not elementwise and so not allowed inside an LSTM or a GRU.
LstmSpec parse_lstm_spec(const char* op, const std::string& activation, double alpha, const std::string& gate,
                         double gate_alpha);
// x: (n, t, c); w: (c, 4h); rw: (h, 4h); b: (4h); mask: (n, t) or null (all ones); h0, c0: (n, h) or null
// (zero initial state). Writes hs, cs, act_c = activation(c before masking): (n, t, h) and gates:
// (n, t, 4h) activated gate values.
template <typename T>
void lstm_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                  const T* mask, const T* h0, const T* c0, T* hs, T* cs, T* gates, T* act_c);
// Backward of lstm_forward (same x, w, rw, mask, h0, c0 and its outputs) given dh = dL/dhs: (n, t, h).
// Writes dgates: (n, t, 4h) = dL/d(pre-activations), dw: (c, 4h), drw: (h, 4h), db: (4h) and dx: (n, t, c)
// unless null. No gradient flows into h0 / c0 (truncated BPTT and stateful inference stop there), nor
// through the steps before first_step (0 <= first_step < t: truncated BPTT's backward length).
template <typename T>
void lstm_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                   const T* h0, const T* c0, const T* hs, const T* cs, const T* gates, const T* act_c, const T* dh,
                   T* dgates, T* dx, T* dw, T* drw, T* db, std::int64_t first_step);

// ---- GRU over a whole sequence (cpp/src/nn/gru.cpp) -----------------------------------------------
// libnd4j's GRU cell (DL4J's): gate blocks of the 3h columns [reset r, update u, candidate c];
// r, u = gate(x_t W + h_{t-1} RW + b), c = activation(x_t W_c + (r h_{t-1}) RW_c + b_c),
// h = u h_{t-1} + (1 - u) c. spec.activation is the candidate's (DL4J default tanh), spec.gate r's and u's
// (sigmoid). A mask value m at (example, step) multiplies that step's h (0: the step outputs zero and the
// next step starts from a zero state). Shapes as LstmShape (n, t, c, h).
// x: (n, t, c); w: (c, 3h); rw: (h, 3h); b: (3h); mask: (n, t) or null (all ones); h0: (n, h) or null (zero
// initial state). Writes hs: (n, t, h) the outputs and gates: (n, t, 3h) the activated [r, u, c].
template <typename T>
void gru_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                 const T* mask, const T* h0, T* hs, T* gates);
// Backward of gru_forward (same x, w, rw, mask, h0 and its outputs) given dh = dL/dhs: (n, t, h). Writes
// dgates: (n, t, 3h) = dL/d(pre-activations), dw: (c, 3h), drw: (h, 3h), db: (3h) and dx: (n, t, c) unless
// null. No gradient flows into h0, nor through the steps before first_step (0 <= first_step < t).
template <typename T>
void gru_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                  const T* h0, const T* hs, const T* gates, const T* dh, T* dgates, T* dx, T* dw, T* drw, T* db,
                  std::int64_t first_step);

// ---- SimpleRnn over a whole sequence (cpp/src/nn/simple_rnn.cpp) ---------------------------------
// DL4J's SimpleRnn: h_t = m * activation(x_t W + h_{t-1} RW + b) with m the mask value at (example,
// step) (0: the step outputs zero and the next step starts from a zero state). Shapes as LstmShape
// (n, t, c, h). Softmax (an activation inherited from the network) normalizes each row of h values.
// x: (n, t, c); w: (c, h); rw: (h, h); b: (h); mask: (n, t) or null (all ones); h0: (n, h) or null (zero
// initial state). Writes hs: (n, t, h) the outputs and act: (n, t, h) = activation(...) before the mask.
template <typename T>
void simple_rnn_forward(Activation kind, double alpha, const LstmShape& s, const T* x, const T* w, const T* rw,
                        const T* b, const T* mask, const T* h0, T* hs, T* act);
// Backward of simple_rnn_forward (same x, w, rw, mask, h0 and its outputs) given dh = dL/dhs: (n, t, h).
// Writes dz: (n, t, h) = dL/d(pre-activations), dw: (c, h), drw: (h, h), db: (h) and dx: (n, t, c) unless
// null. No gradient flows into h0, nor through the steps before first_step (0 <= first_step < t).
template <typename T>
void simple_rnn_backward(Activation kind, double alpha, const LstmShape& s, const T* x, const T* w,
                         const T* rw, const T* mask, const T* h0, const T* hs, const T* act, const T* dh, T* dz,
                         T* dx, T* dw, T* drw, T* db, std::int64_t first_step);

// ---- graph vertices (cpp/src/nn/vertex.cpp) -------------------------------------------------------
enum class ElementWiseOp : std::uint8_t { Add, Subtract, Product, Average, Max };
// Parses "add", "subtract", "product", "average" or "max"; throws std::invalid_argument otherwise.
ElementWiseOp parse_elementwise_op(const char* op, const std::string& name);

// inputs: k >= 1 pointers to (size) arrays (k == 2 for Subtract); y: (size), may alias no input.
// Max takes the first maximal input at ties.
template <typename T>
void elementwise_forward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, T* y, std::int64_t size);
// dy: (size); dx: k pointers to (size) arrays, dx[i] = dL/d inputs[i] (Max routes dy to the input the
// forward chose). Product and Max read the inputs. No dx may alias dy or another dx.
template <typename T>
void elementwise_backward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, const T* dy, T* const* dx,
                          std::int64_t size);

// x, y: (size); y = x * scale + shift (y may alias x). Also the backward of scale (shift 0).
template <typename T>
void scale_shift(const T* x, T* y, std::int64_t size, double scale, double shift);

// x, y: (n, d); norms: (n) = max(||x_i||_2, eps); y_i = x_i / norms_i. y may not alias x.
template <typename T>
void l2_normalize_forward(const T* x, T* y, T* norms, std::int64_t n, std::int64_t d, double eps);
// y, norms as written by the forward; dy, dx: (n, d). Rows whose norm was clamped to eps back-propagate
// dy / eps; the others (dy - y <dy, y>) / norm. dx may alias dy.
template <typename T>
void l2_normalize_backward(const T* y, const T* norms, const T* dy, T* dx, std::int64_t n, std::int64_t d,
                           double eps);

// a, b: (n, d); y: (n) = ||a_i - b_i||_2.
template <typename T>
void l2_distance_forward(const T* a, const T* b, T* y, std::int64_t n, std::int64_t d);
// y as written by the forward, dy: (n); da, db: (n, d) = +-dy_i (a_i - b_i) / max(y_i, eps).
template <typename T>
void l2_distance_backward(const T* a, const T* b, const T* y, const T* dy, T* da, T* db, std::int64_t n,
                          std::int64_t d, double eps);

// ---- CUDA twins (cuda/nn/*.cu; cuda/no_cuda.cpp throws when built without CUDA) -----------------
// Same declarations, shapes and semantics as above; every array pointer is a device pointer of the
// current device (argmax included). Each call queues its work on the calling thread's stream
// (gpu::set_stream: the binding passes CuPy's current stream) and returns without waiting for it, unless
// gpu::sync_each_op() is on: then it waits, so an asynchronous fault surfaces at the op that caused it.
namespace cuda {

template <typename T>
void bias_add(T* x, const T* b, std::int64_t n, std::int64_t c, std::int64_t inner);
template <typename T>
void bias_grad(const T* dy, T* db, std::int64_t n, std::int64_t c, std::int64_t inner);
template <typename T>
void swap_last_axes(const T* x, T* y, std::int64_t n, std::int64_t rows, std::int64_t cols);

template <typename T>
void activation_forward(Activation kind, double alpha, const T* x, T* y, std::int64_t rows, std::int64_t cols);
template <typename T>
void activation_backward(Activation kind, double alpha, const T* x, const T* y, const T* dy, T* dx,
                         std::int64_t rows, std::int64_t cols);

template <typename T>
void loss_score(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                T* scores, std::int64_t n, std::int64_t c);
template <typename T>
void loss_gradient(const LossSpec& spec, const T* labels, const T* preout, const T* mask, MaskLayout layout,
                   T* grad, std::int64_t n, std::int64_t c);

// What `requested` runs as on the GPU for g (Im2col or Cudnn, never Auto); throws "[op] ..." for
// Winograd, or for cuDNN in a build without it.
ConvAlgorithm conv2d_algorithm(const char* op, const Conv2dShape& g, ConvAlgorithm requested);
template <typename T>
void conv2d_forward(const Conv2dShape& g, const T* x, const T* weights, const T* b, T* y, bool relu = false,
                    ConvAlgorithm algorithm = ConvAlgorithm::Auto);
template <typename T>
void conv2d_backward_input(const Conv2dShape& g, const T* dy, const T* weights, const T* b, T* dx, bool relu = false,
                           ConvAlgorithm algorithm = ConvAlgorithm::Auto);
template <typename T>
void conv2d_backward_weight(const Conv2dShape& g, const T* x, const T* dy, T* dw,
                            ConvAlgorithm algorithm = ConvAlgorithm::Auto);
template <typename T>
void conv2d_forward_backward_weight(const Conv2dShape& g, const T* x, const T* weights, const T* dy, T* y, T* dw,
                                    ConvAlgorithm algorithm = ConvAlgorithm::Auto);

template <typename T>
void pool2d_forward(PoolKind kind, const Pool2dShape& g, const T* x, T* y, std::int64_t* argmax);
template <typename T>
void pool2d_backward(PoolKind kind, const Pool2dShape& g, const T* dy, T* dx, const std::int64_t* argmax);
template <typename T>
void global_pool_forward(PoolKind kind, const T* x, T* y, std::int64_t* argmax, std::int64_t planes,
                         std::int64_t size);
template <typename T>
void global_pool_backward(PoolKind kind, const T* dy, T* dx, const std::int64_t* argmax, std::int64_t planes,
                          std::int64_t size);

template <typename T>
void batchnorm_forward_train(const BatchNormShape& g, const T* x, const T* gamma, const T* beta, T* y,
                             T* batch_mean, T* batch_var, T* running_mean, T* running_var, double decay,
                             double eps);
template <typename T>
void batchnorm_forward_inference(const BatchNormShape& g, const T* x, const T* gamma, const T* beta,
                                 const T* running_mean, const T* running_var, T* y, double eps);
template <typename T>
void batchnorm_backward(const BatchNormShape& g, const T* x, const T* dy, const T* gamma, const T* batch_mean,
                        const T* batch_var, T* dx, T* dgamma, T* dbeta, double eps);

// One block per row; the column sums of the backward add rows in the CPU's order of blocks.
template <typename T>
void layer_norm_forward(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t c, double eps);
template <typename T>
void layer_norm_backward(const T* x, const T* dy, const T* gain, const T* mean, const T* rstd, T* dx, T* dgain,
                         T* dbias, std::int64_t rows, std::int64_t c);

// The products of each head as one strided-batched cuBLAS GEMM over the examples; the masked softmax and its
// backward one block per row.
template <typename T>
void attention_forward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* mask, double scale,
                       T* weights, T* y);
template <typename T>
void attention_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* weights, const T* dy,
                        double scale, T* dweights, T* dq, T* dk, T* dv);

// Index check in one kernel and one read-back of its result; the backward adds in ascending position
// order per row without atomics (bit-identical to the CPU).
template <typename T>
void embedding_forward(const std::int64_t* indices, const T* w, T* y, std::int64_t n, std::int64_t vocab,
                       std::int64_t dim, std::int64_t* first_bad);
template <typename T>
void embedding_backward(const std::int64_t* indices, const T* dy, T* dw, std::int64_t n, std::int64_t vocab,
                        std::int64_t dim, std::int64_t* first_bad);

// The same (seed, i) -> mask draw as the CPU kernel: bit-identical masks on both devices.
template <typename T>
void dropout_forward(const T* x, T* y, T* mask, std::int64_t size, double retain, std::uint64_t seed);
template <typename T>
void dropout_backward(const T* dy, const T* mask, T* dx, std::int64_t size);

// Input projection of every step in one cuBLAS GEMM, one recurrent GEMM and one fused gate kernel per step.
template <typename T>
void lstm_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                  const T* mask, const T* h0, const T* c0, T* hs, T* cs, T* gates, T* act_c);
template <typename T>
void lstm_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                   const T* h0, const T* c0, const T* hs, const T* cs, const T* gates, const T* act_c, const T* dh,
                   T* dgates, T* dx, T* dw, T* drw, T* db, std::int64_t first_step);

// The input projection of every step in one cuBLAS GEMM, then per step two recurrent GEMMs ([r | u], then
// the candidate's from r h_{t-1}) each followed by one fused kernel.
template <typename T>
void gru_forward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* b,
                 const T* mask, const T* h0, T* hs, T* gates);
template <typename T>
void gru_backward(const LstmSpec& spec, const LstmShape& s, const T* x, const T* w, const T* rw, const T* mask,
                  const T* h0, const T* hs, const T* gates, const T* dh, T* dgates, T* dx, T* dw, T* drw, T* db,
                  std::int64_t first_step);

// The input projection of every step in one cuBLAS GEMM, then one recurrent GEMM and one fused kernel per
// step; softmax normalizes each row of h values as on the CPU.
template <typename T>
void simple_rnn_forward(Activation kind, double alpha, const LstmShape& s, const T* x, const T* w, const T* rw,
                        const T* b, const T* mask, const T* h0, T* hs, T* act);
template <typename T>
void simple_rnn_backward(Activation kind, double alpha, const LstmShape& s, const T* x, const T* w,
                         const T* rw, const T* mask, const T* h0, const T* hs, const T* act, const T* dh, T* dz,
                         T* dx, T* dw, T* drw, T* db, std::int64_t first_step);

// inputs and dx are host arrays of k device pointers.
template <typename T>
void elementwise_forward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, T* y, std::int64_t size);
template <typename T>
void elementwise_backward(ElementWiseOp kind, const T* const* inputs, std::int64_t k, const T* dy, T* const* dx,
                          std::int64_t size);
template <typename T>
void scale_shift(const T* x, T* y, std::int64_t size, double scale, double shift);
template <typename T>
void l2_normalize_forward(const T* x, T* y, T* norms, std::int64_t n, std::int64_t d, double eps);
template <typename T>
void l2_normalize_backward(const T* y, const T* norms, const T* dy, T* dx, std::int64_t n, std::int64_t d,
                           double eps);
template <typename T>
void l2_distance_forward(const T* a, const T* b, T* y, std::int64_t n, std::int64_t d);
template <typename T>
void l2_distance_backward(const T* a, const T* b, const T* y, const T* dy, T* da, T* db, std::int64_t n,
                          std::int64_t d, double eps);

}  // namespace cuda

}  // namespace sparkgrad::nn
