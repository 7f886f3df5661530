// Differentiable ops on float32 tensors (plus argmin/argmax, no gradient).
//
// Every op runs its arithmetic through the DeviceKernels (engine/device.h)
// of its operands' device, the CPU's included (engine/cpu/cpu_kernels.h);
// all operands of one op must be on the same device.
//
// Broadcasting follows NumPy: shapes are aligned at the trailing dimension
// and a dimension of size 1 (or a missing leading one) is repeated. The
// common cases are a scalar and a trailing row ([N, D] op [D]); a column
// ([K, D] op [K, 1]) works too. The gradient of a broadcast input is summed
// back to that input's shape. Reductions and scatter-adds run in ascending
// index order, so every result is deterministic run to run.
#pragma once

#include <array>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

// ---- elementwise, with broadcasting ------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float b);
Tensor sub(const Tensor& a, float b);
Tensor mul(const Tensor& a, float b);
Tensor div(const Tensor& a, float b);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, float b);
Tensor operator-(const Tensor& a);

// The shape a and b broadcast to; throws naming both shapes if they do not.
Shape broadcast_shape(const Shape& a, const Shape& b);
// Sums `grad` over the broadcast dimensions so it has `shape` (no autograd).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

// ---- elementwise, unary ------------------------------------------------------
Tensor neg(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact form: x * Phi(x), Phi the normal CDF
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// The codec activations: elu(x) = x for x > 0, else alpha (e^x - 1);
// leaky_relu(x) = x for x > 0, else slope x; silu(x) = x sigmoid(x) (swish).
Tensor elu(const Tensor& x, float alpha = 1.f);
Tensor leaky_relu(const Tensor& x, float slope = 0.01f);
Tensor silu(const Tensor& x);
// |x|; gradient sign(x), 0 at 0 (an L1 loss's).
Tensor abs(const Tensor& x);
// Gradient passes where low <= x <= high (boundaries included, as in PyTorch).
Tensor clamp(const Tensor& x, float low, float high);
// Half away from zero (std::round); gradient 0 (a step function: FSQ passes
// the gradient straight through around it).
Tensor round(const Tensor& x);
// Rounded toward minus infinity; gradient 0.
Tensor floor(const Tensor& x);
// 1 where x > 0, else 0 (NaN: 0): a mask for where-like blends
// (mask * a + (1 - mask) * b is exactly a or b); gradient 0.
Tensor positive(const Tensor& x);
// erf, atan and tan computed in double and rounded to float; sign(0) = 0
// with gradient 0 (a step function), as torch.
Tensor erf(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor tan(const Tensor& x);
// x rounded to the TF32 / bfloat16 inputs of tensor cores, kept as float32
// (engine/kernel_math.h's round_to_tf32 / round_to_bf16; run.precision:
// engine/precision.h); the gradient of a cast passes through.
Tensor to_tf32(const Tensor& x);
Tensor to_bf16(const Tensor& x);

// ---- reductions ----------------------------------------------------------------
// Sums accumulate in double in ascending index order, then round once.
Tensor sum(const Tensor& x);                                      // shape []
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);                                     // shape []
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
// Index of the smallest/largest value along the last dim (int64, no grad).
// Ties go to the LOWEST index. NaN is never chosen over a number; a row of
// only NaN gives index 0.
Tensor argmin(const Tensor& x);
Tensor argmax(const Tensor& x);
// The largest value along the last dim, kept as a dim of 1, under argmax's
// order (a number beats NaN); a constant (no gradient).
Tensor max_last(const Tensor& x);

// Row-wise compositions (differentiable through their parts):
// softmax along the last dim (the row maximum subtracted first);
Tensor softmax_rows(const Tensor& logits);
// -sum p log p along the last dim, log's argument clamped at 1e-5 (as
// vector-quantize-pytorch's LFQ does);
Tensor entropy_rows(const Tensor& p);
// each row of [N, D] divided by its L2 norm, clamped below at 1e-12 as
// torch.nn.functional.normalize does (a zero row stays finite).
Tensor l2_normalize_rows(const Tensor& x);

// ---- linear algebra ------------------------------------------------------------
// op(a) @ op(b) for 2-D a, b, where op transposes when the flag is set.
// Forward: batch-invariant, the same bits for a row whatever the batch, the
// split or the device (engine/cpu/fixed_gemm.h). Backward: in an exact step
// (exact_batch.h) the same fixed-order GEMM, as unit partials where the
// step asks for them, so gradients do not depend on the split; outside one,
// the device's BLAS (OpenBLAS, cuBLAS). No transposed copy is ever made.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// ---- convolution ---------------------------------------------------------------
// PyTorch's conventions: x [N, C, L] (1-D) or [N, C, H, W] (2-D); a
// convolution's weight [C_out, C / groups, (KH,) K], a transposed one's
// [C, C_out / groups, (KH,) K]; bias [C_out] or undefined (none). The
// output length is (L + 2 pad - dil (K - 1) - 1) / stride + 1, and for the
// transposed (L - 1) stride - 2 pad + dil (K - 1) + output_padding + 1.
// The forward pass is batch-invariant (a sample's output never depends on
// the rest of the batch) and the same bits on every device (one
// fixed-order kernel per convolution, or im2col around matmul,
// engine/ops_conv.cpp). A one-group convolution's input gradient is its
// fixed-order kernel on every path; weight gradients (and a grouped
// convolution's gradients) are matmul's: the fixed-order products in an
// exact step, the device's BLAS outside one.
struct ConvOptions {  // per dimension (h, w) for 2-D
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1}, output_padding{0, 0};
  int64_t groups = 1;
};
struct Conv1dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, output_padding = 0, groups = 1;
  // Causal (padding and output_padding 0): output t sees input up to its
  // own stride's last sample, never later. A convolution pads
  // dil (K - 1) - (stride - 1) zeros on the left only (L -> L / stride for
  // L a multiple of it); a transposed one cuts dil (K - 1) + 1 - stride
  // samples off its right end (L -> L stride), so its output never waits
  // for a later input frame (EnCodec's and Mimi's causal layers).
  bool causal = false;
};
// The one formula of both causal padings, dil (K - 1) + 1 - stride: a
// convolution's left zeros, a transposed one's overhang cut. Refused,
// naming the op, with padding or output_padding, or a kernel shorter than
// its stride.
int64_t causal_padding(int64_t kernel, const Conv1dOptions& o, bool transposed);
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o = {});
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o = {});
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o = {});
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o = {});
// The data movement under them (engine/conv_plan.h), each the other's
// backward: im2col of x [N, C, H, W] for a kernel kh x kw, giving
// [N * OH * OW, C * kh * kw]; and col2im of such columns back onto an image
// of `image` shape [N, C, H, W], overlapping entries summed.
Tensor unfold(const Tensor& x, int64_t kh, int64_t kw, const ConvOptions& o);
Tensor fold(const Tensor& cols, const Shape& image, int64_t kh, int64_t kw, const ConvOptions& o);

// ---- shape -----------------------------------------------------------------------
// View with a new shape (same storage); one dimension may be -1.
Tensor reshape(const Tensor& x, const Shape& shape);
// View of rows [begin, end) of the first dimension (same storage).
Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end);
// The last dimension with `left` zeros before it and `right` after (a
// causal convolution's left padding, model.causal); a negative count cuts
// that many entries off that end instead (a causal transposed
// convolution's overhang). Each is the other's backward.
Tensor pad_last(const Tensor& x, int64_t left, int64_t right);
// Copy with dimensions d0 and d1 swapped (default: the two of a matrix).
Tensor transpose(const Tensor& x, int64_t d0 = 0, int64_t d1 = 1);
// Joins tensors along `dim`; all other dimensions must match.
Tensor concat(const std::vector<Tensor>& xs, int64_t dim = 0);
// Whether an op checks the range of its indices: `checked` for indices
// from outside (a user's decode input, a checkpoint), which costs one
// min/max read on a device; `trusted` for indices our own code made (an
// assignment, a sampler's row list), which a training step must not wait
// to check again.
enum class Indices { checked, trusted };
// Rows of x (first dimension) picked by int64 `index` [M]: result [M, ...].
// Backward scatter-adds into the picked rows in ascending position order.
Tensor index_select(const Tensor& x, const Tensor& index, Indices from = Indices::checked);
// In place, no autograd: dst[index[i], ...] = src[i, ...] * scale for
// float32 dst and src on one device; `index` int64 [M], values in range.
void index_copy_(Tensor& dst, const Tensor& index, const Tensor& src, float scale = 1.f,
                 Indices from = Indices::checked);
// Throws naming `what`, the first bad position and value when an int64
// index lies outside [0, rows) (one min/max read on a device).
void check_index_range(const Tensor& index, int64_t rows, const char* what);

// ---- checks ------------------------------------------------------------------------
// Flat position of the first NaN or Inf of a float32 tensor (any device), or -1.
int64_t first_nonfinite(const Tensor& x);

// ---- devices ---------------------------------------------------------------------
// x on `device` (a copy; x itself when already there). The gradient goes
// back to x's device, so a CPU-only step inside a GPU graph stays
// differentiable.
Tensor to_device(const Tensor& x, Device device);

// ---- losses ------------------------------------------------------------------------
// mean((a - b)^2) over all elements; shape [].
Tensor mse_loss(const Tensor& a, const Tensor& b);

}  // namespace vqddp
