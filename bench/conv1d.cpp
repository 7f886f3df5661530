// Convolution forward + backward (autograd) at neural-codec shapes against a
// plain OpenBLAS sgemm of the same FLOPs, in the same process.
//
// Each case times y = conv(x, w, b); sum(y * r).backward() with x, w and b
// all requiring gradients (grads dropped between reps). FLOPs: 2 * MACs for
// the forward and twice that for the backward (dx and dw), 3x the forward
// in all. The baseline runs the conv's forward GEMM three times:
// [N*L_out, C_in*K] x [C_in*K, C_out] for a convolution, [N*L_in, C_in] x
// [C_in, C_out*K] for a transposed one. ratio = conv time / sgemm time
// (above 1: the conv is slower). unfold and fold (one of each per fwd+bwd)
// are also timed alone on the same geometry, without autograd; "im2col
// share" is their sum over the fwd+bwd time.
//
// Not a test: it prints medians and asserts nothing about time.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/autograd.h"
#include "engine/cpu/blas.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/ops.h"
#include "engine/cpu/parallel.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

enum class Kind { conv1d, conv_transpose1d, conv2d };

struct Case {
  const char* name;
  Kind kind;
  int64_t n, cin, cout, k, stride, pad, dil, out_pad;
  int64_t len;  // L (1-D) or H = W (2-D)
};

void run_case(const Case& c, int reps) {
  Generator g(1, 0);
  bool two_d = c.kind == Kind::conv2d, transposed = c.kind == Kind::conv_transpose1d;
  Shape xs = two_d ? Shape{c.n, c.cin, c.len, c.len} : Shape{c.n, c.cin, c.len};
  Shape ws = transposed ? Shape{c.cin, c.cout, c.k} : two_d ? Shape{c.cout, c.cin, c.k, c.k} : Shape{c.cout, c.cin, c.k};
  Tensor x = rand_normal(xs, g).set_requires_grad(true), w = rand_normal(ws, g, 0.f, 0.1f).set_requires_grad(true);
  Tensor b = rand_normal({c.cout}, g).set_requires_grad(true);
  Conv1dOptions o1;
  o1.stride = c.stride, o1.padding = c.pad, o1.dilation = c.dil, o1.output_padding = c.out_pad;
  ConvOptions o2;
  o2.stride = {c.stride, c.stride}, o2.padding = {c.pad, c.pad}, o2.dilation = {c.dil, c.dil};
  o2.output_padding = {c.out_pad, c.out_pad};
  auto forward = [&] {
    switch (c.kind) {
      case Kind::conv1d: return conv1d(x, w, b, o1);
      case Kind::conv_transpose1d: return conv_transpose1d(x, w, b, o1);
      case Kind::conv2d: return conv2d(x, w, b, o2);
    }
    return Tensor();
  };
  Shape ys;
  {
    NoGradGuard no_grad;
    ys = forward().shape();
  }
  Tensor r = rand_normal(ys, g);
  auto step = [&] {
    x.zero_grad(), w.zero_grad(), b.zero_grad();
    sum(mul(forward(), r)).backward();
  };
  step();  // warm-up: allocator, pool, BLAS buffers
  double conv_ms = bench::median_ms(step, reps);

  // The forward GEMM [m, kd] x [kd, nn] and the unfold/fold geometry: the
  // input for a convolution, the output for a transposed one (its forward
  // folds onto y, its backward unfolds dy).
  int64_t lo = two_d ? ys[2] * ys[3] : ys[2], li = two_d ? c.len * c.len : c.len, kk = two_d ? c.k * c.k : c.k;
  int64_t m = transposed ? c.n * li : c.n * lo, kd = transposed ? c.cin : c.cin * kk;
  int64_t nn = transposed ? c.cout * kk : c.cout;
  std::vector<float> a = rand_normal({m, kd}, g).to_vector<float>(), bt = rand_normal({nn, kd}, g).to_vector<float>();
  std::vector<float> out(m * nn);
  auto gemm3 = [&] {
    for (int i = 0; i < 3; ++i) blas_sgemm(false, true, m, nn, kd, 1.f, a.data(), kd, bt.data(), kd, 0.f, out.data(), nn);
  };
  gemm3();
  double gemm_ms = bench::median_ms(gemm3, reps);

  Tensor image = transposed ? rand_normal({ys[0], ys[1], 1, ys[2]}, g)
                 : two_d    ? x.detach()
                            : reshape(x.detach(), {c.n, c.cin, 1, c.len});
  int64_t kh = two_d ? c.k : 1;
  ConvOptions ou = two_d ? o2 : ConvOptions{};
  if (!two_d) ou.stride[1] = c.stride, ou.padding[1] = c.pad, ou.dilation[1] = c.dil;
  double unfold_ms, fold_ms;
  {
    NoGradGuard no_grad;
    Tensor cols = unfold(image, kh, c.k, ou);
    unfold_ms = bench::median_ms([&] { unfold(image, kh, c.k, ou); }, reps);
    fold_ms = bench::median_ms([&] { fold(cols, image.shape(), kh, c.k, ou); }, reps);
  }

  double flops = 3 * 2.0 * m * kd * nn;
  fmt::print("{:34} {:>14} {:9.2f} ms {:6.1f} GFLOP/s | 3 sgemm {:7.2f} ms {:6.1f} GFLOP/s | ratio {:5.2f} | "
             "unfold {:6.2f} ms fold {:6.2f} ms share {:4.1f}%\n",
             c.name, fmt::format("{}x{}x{}", m, kd, nn), conv_ms, flops / conv_ms / 1e6, gemm_ms,
             flops / gemm_ms / 1e6, conv_ms / gemm_ms, unfold_ms, fold_ms, 100 * (unfold_ms + fold_ms) / conv_ms);
}

}  // namespace

// Arguments, both optional: a part of the cases' names to run only those,
// and one thread count to run at (both 1 and 2 by default).
int main(int argc, char** argv) {
  blas_prefer_fast_core(argv);
  std::string only = argc > 1 ? argv[1] : "";
  std::vector<int> thread_counts = argc > 2 ? std::vector<int>{std::stoi(argv[2])} : std::vector<int>{1, 2};
  // Encoder strides use K = 2 stride, pad = ceil(stride / 2): L_out = L / stride.
  const Case cases[] = {
      {"conv1d 1->32 K7 p3 L1600", Kind::conv1d, 16, 1, 32, 7, 1, 3, 1, 0, 1600},
      {"conv1d 32->32 K3 d3 p3 L1600", Kind::conv1d, 16, 32, 32, 3, 1, 3, 3, 0, 1600},
      {"conv1d 32->64 K4 s2 p1 L1600", Kind::conv1d, 16, 32, 64, 4, 2, 1, 1, 0, 1600},
      {"conv1d 64->128 K8 s4 p2 L800", Kind::conv1d, 16, 64, 128, 8, 4, 2, 1, 0, 800},
      {"conv1d 128->256 K10 s5 p3 L200", Kind::conv1d, 16, 128, 256, 10, 5, 3, 1, 0, 200},
      {"convT1d 256->128 K10 s5 p3 op1 L40", Kind::conv_transpose1d, 16, 256, 128, 10, 5, 3, 1, 1, 40},
      {"conv2d N64 1->32 K4 s2 p1 28x28", Kind::conv2d, 64, 1, 32, 4, 2, 1, 1, 0, 28},
      // examples/speech_codec.json's layers (train/networks.cpp), in order: channels 8, 64, 128, strides 8, 5.
      {"main conv1d 1->8 K7 p3 L1600", Kind::conv1d, 16, 1, 8, 7, 1, 3, 1, 0, 1600},
      {"main conv1d 8->8 K3 p1 L1600", Kind::conv1d, 16, 8, 8, 3, 1, 1, 1, 0, 1600},
      {"main conv1d 8->8 K1 L1600", Kind::conv1d, 16, 8, 8, 1, 1, 0, 1, 0, 1600},
      {"main conv1d 8->64 K16 s8 p4 L1600", Kind::conv1d, 16, 8, 64, 16, 8, 4, 1, 0, 1600},
      {"main conv1d 64->64 K3 p1 L200", Kind::conv1d, 16, 64, 64, 3, 1, 1, 1, 0, 200},
      {"main conv1d 64->64 K1 L200", Kind::conv1d, 16, 64, 64, 1, 1, 0, 1, 0, 200},
      {"main conv1d 64->128 K10 s5 p3 L200", Kind::conv1d, 16, 64, 128, 10, 5, 3, 1, 0, 200},
      {"main conv1d 128->16 K3 p1 L40", Kind::conv1d, 16, 128, 16, 3, 1, 1, 1, 0, 40},
      {"main conv1d 16->128 K7 p3 L40", Kind::conv1d, 16, 16, 128, 7, 1, 3, 1, 0, 40},
      {"main convT1d 128->64 K10 s5 p3 op1 L40", Kind::conv_transpose1d, 16, 128, 64, 10, 5, 3, 1, 1, 40},
      {"main convT1d 64->8 K16 s8 p4 L200", Kind::conv_transpose1d, 16, 64, 8, 16, 8, 4, 1, 0, 200},
      {"main conv1d 8->1 K7 p3 L1600", Kind::conv1d, 16, 8, 1, 7, 1, 3, 1, 0, 1600},
  };
  for (int threads : thread_counts) {
    cpu_set_threads(threads);
    fmt::print("N=16 segments (conv2d N=64), OpenBLAS core {}, fixed_gemm {}, {} thread(s); GEMM shown as M x K x N\n",
               blas_core_name(), fixed_gemm_isa(), threads);
    for (const Case& c : cases)
      if (std::string(c.name).find(only) != std::string::npos) run_case(c, 7);
  }
  return 0;
}
