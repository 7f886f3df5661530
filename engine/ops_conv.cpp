// Convolutions as im2col/col2im (conv_plan.h) around the engine's matmul.
//
//   conv:            cols = unfold(x)       [N*OH*OW, C*K]
//                    y    = cols W^T        [N*OH*OW, C_out]  -> [N, C_out, OH, OW]
//   transposed conv: cols = x^T W           [N*H*W, C_out*K]
//                    y    = fold(cols)      [N, C_out, OH, OW]
// Groups run one such product per group on a channel slice of x and of W.
// matmul's forward is batch-invariant (engine/cpu/fixed_gemm.h) and unfold/fold are
// per-sample gathers in a fixed order, so every forward here is too; the
// backward passes are matmul's (the fixed-order GEMM in an exact step,
// engine/exact_batch.h; BLAS otherwise) and each other. A convolution of
// one group runs in one kernel each way (conv_columnless below), on every
// device by the same path: how a device computes it (the CPU's stride-1
// 1-D kernels without an im2col buffer) is its kernel table's choice.
#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/exact_batch.h"
#include "engine/matmul_grads.h"
#include "engine/ops.h"
#include "engine/precision.h"

namespace vqddp {

namespace {

ConvPlan plan_for(const Shape& image, int64_t kh, int64_t kw, const ConvOptions& o) {
  ConvPlan p;
  p.n = image[0], p.c = image[1], p.h = image[2], p.w = image[3];
  p.kh = kh, p.kw = kw;
  p.sh = o.stride[0], p.sw = o.stride[1];
  p.ph = o.padding[0], p.pw = o.padding[1];
  p.dh = o.dilation[0], p.dw = o.dilation[1];
  p.oh = conv_output_size(p.h, kh, p.sh, p.ph, p.dh);
  p.ow = conv_output_size(p.w, kw, p.sw, p.pw, p.dw);
  return p;
}

void check_options(const char* op, int64_t kh, int64_t kw, const ConvOptions& o) {
  VQDDP_CHECK(kh >= 1 && kw >= 1, "{}: kernel size {}x{} must be at least 1", op, kh, kw);
  for (int d = 0; d < 2; ++d) {
    VQDDP_CHECK(o.stride[d] >= 1 && o.dilation[d] >= 1 && o.padding[d] >= 0, "{}: stride {} and dilation {} must be "
                "at least 1 and padding {} at least 0", op, o.stride[d], o.dilation[d], o.padding[d]);
    VQDDP_CHECK(o.output_padding[d] >= 0 && o.output_padding[d] < o.stride[d],
                "{}: output_padding {} must be smaller than the stride {}", op, o.output_padding[d], o.stride[d]);
  }
  VQDDP_CHECK(o.groups >= 1, "{}: groups {} must be at least 1", op, o.groups);
}

// Channels [begin, begin + count) of x [N, C, ...] (a copy unless all).
Tensor channels(const Tensor& x, int64_t begin, int64_t count) {
  if (begin == 0 && count == x.size(1)) return x;
  return transpose(slice_rows(transpose(x, 0, 1), begin, begin + count), 0, 1);
}

// True in an exact step whose units are single examples (a trainer's): a
// unit's rows are then one example's positions, which the image layout
// keeps together, so its unit partials are one strided product.
bool single_example_units() {
  const ExactBatch* b = exact_batch();
  if (!b) return false;
  for (int64_t e : b->unit_examples)
    if (e != 1) return false;
  return true;
}

// conv2d's product, cols [N P, C K] (P positions per example) times
// w2^T (w2 [C_out, C K]), written straight in the image layout
// [N, C_out, P]: one batched GEMM per example, W times that example's
// columns transposed, so no [N P, C_out] rows and no transpose after them
// (nor one of the gradient before the backward). Each element is the
// chain over C K of the row product's fma(cols, w) with the operands
// swapped, and fma's product is exact: the same bits as
// matmul(cols, w2, false, true) transposed to [N, C_out, P].
//
// The backward in an exact step of single-example units takes the same
// chains the row product's backward takes (matmul_grads), from g in the
// image layout: dcols row by row over C_out, and one weight partial per
// example over its positions, each a batched GEMM. Elsewhere it hands g,
// transposed to rows, to matmul_grads itself.
Tensor image_product(const Tensor& cols_in, const Tensor& w2_in, int64_t n) {
  const int64_t p = n > 0 ? cols_in.size(0) / n : 0, ck = cols_in.size(1), cout = w2_in.size(0);
  DeviceKernels& dk = device_of("conv2d", {&cols_in, &w2_in});
  // The inputs in the run's precision (engine/precision.h); the node's
  // edges stay on the caller's tensors.
  const Tensor cols = product_input(cols_in), w2 = product_input(w2_in);
  Tensor out = empty({n, cout, p}, DType::f32, cols.device());
  if (ck == 0) out.fill_(0);
  else if (n > 0 && p > 0 && cout > 0)
    dk.gemm_fixed(false, true, cout, p, ck, static_cast<const float*>(w2.raw_ptr()), ck,
                  static_cast<const float*>(cols.raw_ptr()), ck, static_cast<float*>(out.raw_ptr()), p,
                  {n, 0, p * ck, cout * p});
  Tensor dc = cols.detach(), dw = w2.detach();
  const bool need_c = cols_in.requires_grad(), need_w = w2_in.requires_grad();
  return record_op("conv2d", out, {cols_in, w2_in}, {cols_in, w2_in}, [=](const Tensor& g_in) -> std::vector<Tensor> {
    const Tensor g = product_input(g_in);
    const bool partials_c = wants_unit_partials(0), partials_w = wants_unit_partials(1);
    if (!single_example_units() || partials_c || (need_w && !partials_w) || ck == 0 || p == 0 || cout == 0) {
      Tensor rows = reshape(transpose(g, 1, 2), {n * p, cout});
      return matmul_grads(dc, dw, rows, false, true, need_c, need_w, partials_c, partials_w);
    }
    DeviceKernels& k = device_of("conv2d backward", {&g, &dw});
    auto* pg = static_cast<const float*>(g.raw_ptr());
    Tensor gc, gw;
    if (need_c) {  // dcols [N P, C K]: chains over C_out of fma(g, w)
      gc = empty({n * p, ck}, DType::f32, g.device());
      k.gemm_fixed(true, false, p, ck, cout, pg, p, static_cast<const float*>(dw.raw_ptr()), ck,
                   static_cast<float*>(gc.raw_ptr()), ck, {n, cout * p, 0, p * ck});
    }
    if (need_w) {  // one partial per example: chains over its positions of fma(g, cols)
      gw = empty({n, cout, ck}, DType::f32, g.device());
      k.gemm_fixed(false, false, cout, ck, p, pg, p, static_cast<const float*>(dc.raw_ptr()), ck,
                   static_cast<float*>(gw.raw_ptr()), ck, {n, cout * p, p * ck, cout * ck});
    }
    return {gc, gw};
  });
}

Tensor add_bias(const Tensor& y, const Tensor& bias, const char* op) {
  if (!bias.defined()) return y;
  VQDDP_CHECK(bias.dim() == 1 && bias.size(0) == y.size(1), "{}: bias {} must be [{}]", op, bias.desc(), y.size(1));
  return y + reshape(bias, {y.size(1), 1, 1});
}

// A convolution of one group, plain or transposed, in one kernel each way
// (DeviceKernels::conv_fixed and its gradients): no columns tensor, the
// bias added in the product's own launch, and in an exact step of
// single-example units (a trainer's) the weight's per-example partials
// straight from the two activations. A transposed convolution is the
// plain one's data gradient, so the three kernels serve both, in swapped
// roles. `p` is the plain convolution's plan: its image is x (plain) or y
// (transposed), its output positions y's or x's; `kc` (the kernels' cout)
// is the weight's first dimension either way.
//
// The bits of the column path (unfold or matmul, image_product or fold,
// add_bias): the kernels compute its elements in its order (conv_plan.h),
// and the bias's gradient is add's (g summed down to [C_out, 1, 1]).
// Other backward cases (a weight gradient outside an exact step, units of
// several examples) rebuild the columns and take matmul's own gradient.
Tensor conv_columnless(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias, const ConvPlan& p,
                       bool transposed) {
  const char* op = transposed ? "conv_transpose2d" : "conv2d";
  const int64_t kc = weight_in.size(0), ck = p.col_width(), pos = p.oh * p.ow;
  const Shape out_shape = transposed ? Shape{p.n, p.c, p.h, p.w} : Shape{p.n, kc, p.oh, p.ow};
  if (bias.defined())
    VQDDP_CHECK(bias.dim() == 1 && bias.size(0) == out_shape[1] && bias.dtype() == DType::f32,
                "{}: bias {} must be float32 [{}]", op, bias.desc(), out_shape[1]);
  DeviceKernels& dk = bias.defined() ? device_of(op, {&x_in, &weight_in, &bias}) : device_of(op, {&x_in, &weight_in});
  // The inputs in the run's precision (engine/precision.h; the bias is
  // added, not multiplied); the node's edges stay on the caller's tensors.
  const Tensor x = product_input(x_in), weight = product_input(weight_in);
  auto f = [](const Tensor& t) { return static_cast<const float*>(t.raw_ptr()); };
  Tensor y = empty(out_shape, DType::f32, x.device());
  const float* pb = bias.defined() ? f(bias) : nullptr;
  if (y.numel() > 0 && x.numel() > 0) {
    auto* py = static_cast<float*>(y.raw_ptr());
    if (transposed) dk.conv_fixed_data(f(x), f(weight), pb, kc, py, p);
    else dk.conv_fixed(f(x), f(weight), pb, kc, py, p);
  } else if (y.numel() > 0) {
    y.fill_(0);  // no input channels: the bias alone (0 + b, as the column path)
    if (bias.defined()) y = add_bias(y, bias.detach(), op);
  }
  Tensor dx = x.detach(), dw = weight.detach();
  const bool need_x = x_in.requires_grad(), need_w = weight_in.requires_grad(),
             need_b = bias.defined() && bias.requires_grad();
  return record_op(op, y, {x_in, weight_in, bias}, {x_in, weight_in}, [=](const Tensor& g_in) -> std::vector<Tensor> {
    const bool partials_x = wants_unit_partials(0), partials_w = wants_unit_partials(1);
    VQDDP_CHECK(!partials_x, "{}: the input {} is batch-free and the weight batched; an exact step does not support "
                "that convolution", op, dx.desc());
    Tensor gx, gw, gb;
    // The per-example kernels serve an exact step of single-example units;
    // a plain convolution's bias partials then come in the weight's launch.
    const bool per_example = partials_w && single_example_units();
    // (Not in another precision than fp32: the weight's kernel would sum
    // the rounded g into the bias, a sum, not a product, of g_in.)
    const bool bias_with_weight = need_b && need_w && per_example && wants_unit_partials(2) && !transposed &&
                                  product_precision() == Precision::fp32;
    if (need_b && !bias_with_weight) {
      Shape c11{g_in.size(1), 1, 1};
      gb = wants_unit_partials(2) ? unit_sum_to_shape(g_in, c11, op) : sum_to_shape(g_in, c11);
      gb = gb.reshape(wants_unit_partials(2) ? Shape{gb.size(0), g_in.size(1)} : Shape{g_in.size(1)});
    }
    Shape wshape = dw.shape();
    if (partials_w) wshape.insert(wshape.begin(), static_cast<int64_t>(exact_batch()->unit_examples.size()));
    if (g_in.numel() == 0 || dx.numel() == 0) {  // nothing flows: zero gradients of the right shapes
      if (need_x) gx = zeros(dx.shape(), DType::f32, g_in.device());
      if (need_w) gw = zeros(wshape, DType::f32, g_in.device());
      if (bias_with_weight) gb = zeros({wshape[0], g_in.size(1)}, DType::f32, g_in.device());
      return {gx, gw, gb};
    }
    DeviceKernels& k = device_of(op, {&g_in, &dw});
    const Tensor g = product_input(g_in);  // a product's input (the bias's gradient above sums g_in)
    // The image-side and output-side tensors of the plain convolution.
    const Tensor& image = transposed ? g : dx;
    const Tensor& out = transposed ? dx : g;
    if (need_x) {
      gx = empty(dx.shape(), DType::f32, g.device());
      auto* px = static_cast<float*>(gx.raw_ptr());
      if (transposed) k.conv_fixed(f(g), f(dw), nullptr, kc, px, p);
      else k.conv_fixed_data(f(g), f(dw), nullptr, kc, px, p);
    }
    if (need_w && per_example) {
      gw = empty(wshape, DType::f32, g.device());
      if (bias_with_weight) gb = empty({p.n, kc}, DType::f32, g.device());
      k.conv_fixed_weight(f(image), f(out), kc, static_cast<float*>(gw.raw_ptr()),
                          bias_with_weight ? static_cast<float*>(gb.raw_ptr()) : nullptr, p);
    } else if (need_w) {  // the column path's weight gradient: matmul's of cols [N P, C K] and rows [N P, kc]
      ConvOptions o;
      o.stride = {p.sh, p.sw};
      o.padding = {p.ph, p.pw};
      o.dilation = {p.dh, p.dw};
      Tensor cols = unfold(image, p.kh, p.kw, o);
      Tensor rows = reshape(transpose(reshape(out, {p.n, kc, pos}), 1, 2), {p.n * pos, kc});
      Tensor w2 = reshape(dw, {kc, ck});
      gw = transposed ? matmul_grads(rows, w2, cols, false, false, false, true, false, partials_w)[1]
                      : matmul_grads(cols, w2, rows, false, true, false, true, false, partials_w)[1];
      gw = gw.reshape(wshape);
    }
    return {gx, gw, gb};
  });
}

Shape as_2d(const Shape& s) { return {s[0], s[1], 1, s[2]}; }

ConvOptions options_2d(const Conv1dOptions& o) {
  ConvOptions c;
  c.stride = {1, o.stride};
  c.padding = {0, o.padding};
  c.dilation = {1, o.dilation};
  c.output_padding = {0, o.output_padding};
  c.groups = o.groups;
  return c;
}

}  // namespace

Tensor unfold(const Tensor& x, int64_t kh, int64_t kw, const ConvOptions& o) {
  VQDDP_CHECK(x.dim() == 4 && x.dtype() == DType::f32, "unfold: x {} must be float32 [N, C, H, W]", x.desc());
  check_options("unfold", kh, kw, o);
  ConvPlan p = plan_for(x.shape(), kh, kw, o);
  VQDDP_CHECK(p.oh >= 1 && p.ow >= 1, "unfold: input {} is smaller than the {}x{} kernel (dilation {}x{}, padding "
              "{}x{})", x.desc(), kh, kw, o.dilation[0], o.dilation[1], o.padding[0], o.padding[1]);
  Tensor cols = empty({p.rows(), p.col_width()}, DType::f32, x.device());
  device_of("unfold", {&x}).im2col(static_cast<const float*>(x.raw_ptr()), static_cast<float*>(cols.raw_ptr()), p);
  Shape image = x.shape();
  return record_op("unfold", cols, {x}, [image, kh, kw, o](const Tensor& g) -> std::vector<Tensor> {
    return {fold(g, image, kh, kw, o)};
  });
}

Tensor fold(const Tensor& cols, const Shape& image, int64_t kh, int64_t kw, const ConvOptions& o) {
  VQDDP_CHECK(image.size() == 4, "fold: image shape {} must be [N, C, H, W]", shape_str(image));
  check_options("fold", kh, kw, o);
  ConvPlan p = plan_for(image, kh, kw, o);
  VQDDP_CHECK(p.oh >= 1 && p.ow >= 1 && cols.dim() == 2 && cols.size(0) == p.rows() && cols.size(1) == p.col_width() &&
                  cols.dtype() == DType::f32,
              "fold: columns {} do not match image {} with a {}x{} kernel (expected float32 [{}, {}])", cols.desc(),
              shape_str(image), kh, kw, p.rows(), p.col_width());
  Tensor x = empty(image, DType::f32, cols.device());
  device_of("fold", {&cols}).col2im(static_cast<const float*>(cols.raw_ptr()), static_cast<float*>(x.raw_ptr()), p);
  return record_op("fold", x, {cols}, [kh, kw, o](const Tensor& g) -> std::vector<Tensor> {
    return {unfold(g, kh, kw, o)};
  });
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o) {
  VQDDP_CHECK(x.dim() == 4 && weight.dim() == 4, "conv2d: x {} and weight {} must both be 4-D", x.desc(), weight.desc());
  int64_t g = o.groups, cin = x.size(1), cout = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  VQDDP_CHECK(g >= 1 && cin % g == 0 && cout % g == 0 && weight.size(1) == cin / g,
              "conv2d: weight {} does not fit x {} with groups {} (needs [C_out, {}, KH, KW], C_out divisible by {})",
              weight.desc(), x.desc(), g, g >= 1 ? cin / g : 0, g);
  if (g == 1) {
    check_options("conv2d", kh, kw, o);
    ConvPlan p = plan_for(x.shape(), kh, kw, o);
    VQDDP_CHECK(x.dtype() == DType::f32 && weight.dtype() == DType::f32, "conv2d: x {} and weight {} must be float32",
                x.desc(), weight.desc());
    VQDDP_CHECK(p.oh >= 1 && p.ow >= 1, "conv2d: input {} is smaller than the {}x{} kernel (dilation {}x{}, padding "
                "{}x{})", x.desc(), kh, kw, o.dilation[0], o.dilation[1], o.padding[0], o.padding[1]);
    return conv_columnless(x, weight, bias, p, false);
  }
  int64_t cg = cin / g, og = cout / g;
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < g; ++i) {
    Tensor cols = unfold(channels(x, i * cg, cg), kh, kw, o);
    Tensor w = reshape(slice_rows(weight, i * og, (i + 1) * og), {og, cg * kh * kw});
    parts.push_back(image_product(cols, w, x.size(0)));  // [N, og, OH OW]
  }
  ConvPlan p = plan_for(x.shape(), kh, kw, o);  // unfold checked it
  Tensor y = g == 1 ? parts[0] : concat(parts, 1);
  return add_bias(reshape(y, {x.size(0), cout, p.oh, p.ow}), bias, "conv2d");
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o) {
  VQDDP_CHECK(x.dim() == 4 && weight.dim() == 4, "conv_transpose2d: x {} and weight {} must both be 4-D", x.desc(),
              weight.desc());
  int64_t g = o.groups, cin = x.size(1), n = x.size(0), h = x.size(2), w = x.size(3);
  int64_t og = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  VQDDP_CHECK(g >= 1 && cin % g == 0 && weight.size(0) == cin,
              "conv_transpose2d: weight {} does not fit x {} with groups {} (needs [{}, C_out / groups, KH, KW])",
              weight.desc(), x.desc(), g, cin);
  check_options("conv_transpose2d", kh, kw, o);
  int64_t cg = cin / g;
  int64_t oh = conv_transpose_output_size(h, kh, o.stride[0], o.padding[0], o.dilation[0], o.output_padding[0]);
  int64_t ow = conv_transpose_output_size(w, kw, o.stride[1], o.padding[1], o.dilation[1], o.output_padding[1]);
  VQDDP_CHECK(oh >= 1 && ow >= 1, "conv_transpose2d: x {} gives an empty output with weight {}", x.desc(),
              weight.desc());
  if (g == 1) {
    VQDDP_CHECK(x.dtype() == DType::f32 && weight.dtype() == DType::f32,
                "conv_transpose2d: x {} and weight {} must be float32", x.desc(), weight.desc());
    ConvPlan p = plan_for({n, og, oh, ow}, kh, kw, o);  // the convolution it transposes: [n, og, oh, ow] -> [h, w]
    VQDDP_ASSERT(p.oh == h && p.ow == w, "conv_transpose2d: {}x{} from {}x{} does not invert", oh, ow, h, w);
    return conv_columnless(x, weight, bias, p, true);
  }
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < g; ++i) {
    Tensor xg = channels(x, i * cg, cg);  // [N, cg, H, W] -> rows [N*H*W, cg]
    Tensor rows = reshape(transpose(reshape(xg, {n, cg, h * w}), 1, 2), {n * h * w, cg});
    Tensor wg = reshape(slice_rows(weight, i * cg, (i + 1) * cg), {cg, og * kh * kw});
    parts.push_back(fold(matmul(rows, wg), {n, og, oh, ow}, kh, kw, o));
  }
  Tensor y = g == 1 ? parts[0] : concat(parts, 1);
  return add_bias(y, bias, "conv_transpose2d");
}

int64_t causal_padding(int64_t kernel, const Conv1dOptions& o, bool transposed) {
  const int64_t pad = o.dilation * (kernel - 1) + 1 - o.stride;
  VQDDP_CHECK(o.padding == 0 && o.output_padding == 0 && pad >= 0,
              "{}: a causal {}convolution takes no padding and a kernel at least its stride (kernel {}, stride {}, "
              "padding {})", transposed ? "conv_transpose1d" : "conv1d", transposed ? "transposed " : "", kernel,
              o.stride, o.padding);
  return pad;
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o) {
  VQDDP_CHECK(x.dim() == 3 && weight.dim() == 3, "conv1d: x {} must be [N, C, L] and weight {} [C_out, C / groups, K]",
              x.desc(), weight.desc());
  if (o.causal) {
    const int64_t left = causal_padding(weight.size(2), o, false);
    Conv1dOptions plain = o;
    plain.causal = false;
    return conv1d(pad_last(x, left, 0), weight, bias, plain);
  }
  Tensor y = conv2d(reshape(x, as_2d(x.shape())), reshape(weight, as_2d(weight.shape())), bias, options_2d(o));
  return reshape(y, {y.size(0), y.size(1), y.size(3)});
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o) {
  VQDDP_CHECK(x.dim() == 3 && weight.dim() == 3,
              "conv_transpose1d: x {} must be [N, C, L] and weight {} [C, C_out / groups, K]", x.desc(), weight.desc());
  if (o.causal) {
    const int64_t overhang = causal_padding(weight.size(2), o, true);
    Conv1dOptions plain = o;
    plain.causal = false;
    return pad_last(conv_transpose1d(x, weight, bias, plain), 0, -overhang);
  }
  Tensor y = conv_transpose2d(reshape(x, as_2d(x.shape())), reshape(weight, as_2d(weight.shape())), bias,
                              options_2d(o));
  return reshape(y, {y.size(0), y.size(1), y.size(3)});
}

}  // namespace vqddp
