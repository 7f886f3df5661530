// The CPU's convolution kernels at the discriminators' shapes (the main
// GAN example's STFT and period discriminators, 4 samples: one rank's
// quarter of the batch) and at the main job's codec plans (16 samples: a
// world of one): its two width-strided ones, each also its transposed
// twin's plan, and four stride-1 ones; and the large config's three
// width-strided ones (32 samples). fixed_conv.h's direct kernels
// against the column path (im2col, the fixed-order GEMM with a product per
// sample, col2im) in the same process, forward, input gradient and
// per-sample weight gradients: ratio = column time / direct time (above 1:
// the direct kernel is faster), and a '*' marks the path the kernel table
// takes (direct_conv_paths). The line under each case times the kernel
// table itself, whose column path takes one product over every sample for
// the forward and the input gradient. All must give the same bits; a
// difference is printed and fails the run.
//
// Not a test: it prints medians and asserts nothing about time.
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/conv_plan.h"
#include "engine/core/random.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/fixed_conv.h"
#include "engine/ops.h"

using namespace vqddp;

namespace {

struct Case {
  const char* name;
  int64_t c, h, w, cout, kh, kw, sh, ph, pw, dh, dw;
  int64_t n = 4, sw = 1;
};

// One rank's share of the GAN example: batch 16 over 4 ranks; frames of
// 1600 samples, a 256-sample STFT (hop 64: 129 bins x 22 frames), and
// convolutions of each of the five periods.
const Case kCases[] = {
    {"stft conv0 2->8 (9,3)", 2, 129, 22, 8, 9, 3, 1, 4, 1, 1, 1},
    {"stft conv1 8->8 s(2,1)", 8, 129, 22, 8, 9, 3, 2, 4, 1, 1, 1},
    {"stft conv2 8->8 s(2,1) d(1,2)", 8, 65, 22, 8, 9, 3, 2, 4, 2, 1, 2},
    {"stft conv3 8->8 s(2,1) d(1,4)", 8, 33, 22, 8, 9, 3, 2, 4, 4, 1, 4},
    {"stft conv4 8->8 (3,3)", 8, 17, 22, 8, 3, 3, 1, 1, 1, 1, 1},
    {"stft post 8->1 (3,3)", 8, 17, 22, 1, 3, 3, 1, 1, 1, 1, 1},
    {"period 2 conv0 1->4 s(3,1)", 1, 800, 2, 4, 5, 1, 3, 2, 0, 1, 1},
    {"period 2 conv1 4->8 s(3,1)", 4, 267, 2, 8, 5, 1, 3, 2, 0, 1, 1},
    {"period 2 conv3 16->16", 16, 30, 2, 16, 5, 1, 1, 2, 0, 1, 1},
    {"period 3 conv1 4->8 s(3,1)", 4, 178, 3, 8, 5, 1, 3, 2, 0, 1, 1},
    {"period 5 conv1 4->8 s(3,1)", 4, 107, 5, 8, 5, 1, 3, 2, 0, 1, 1},
    {"period 7 conv1 4->8 s(3,1)", 4, 77, 7, 8, 5, 1, 3, 2, 0, 1, 1},
    {"period 7 conv3 16->16", 16, 9, 7, 16, 5, 1, 1, 2, 0, 1, 1},
    {"period 11 conv0 1->4 s(3,1)", 1, 146, 11, 4, 5, 1, 3, 2, 0, 1, 1},
    {"period 11 conv2 8->16 s(3,1)", 8, 17, 11, 16, 5, 1, 3, 2, 0, 1, 1},
    {"codec 8->64 k16 s8 (x16)", 8, 1, 1600, 64, 1, 16, 1, 0, 4, 1, 1, 16, 8},
    {"codec 64->128 k10 s5 (x16)", 64, 1, 200, 128, 1, 10, 1, 0, 3, 1, 1, 16, 5},
    {"codec 64->64 k3 (x16)", 64, 1, 200, 64, 1, 3, 1, 0, 1, 1, 1, 16, 1},
    {"codec 64->64 k1 (x16)", 64, 1, 200, 64, 1, 1, 1, 0, 0, 1, 1, 16, 1},
    {"codec 8->8 k3 (x16)", 8, 1, 1600, 8, 1, 3, 1, 0, 1, 1, 1, 16, 1},
    {"codec 8->8 k1 (x16)", 8, 1, 1600, 8, 1, 1, 1, 0, 0, 1, 1, 16, 1},
    // speech_codec_large.json's width-strided convolutions (a world of one: 32 samples).
    {"large 16->96 k16 s8 (x32)", 16, 1, 1600, 96, 1, 16, 1, 0, 4, 1, 1, 32, 8},
    {"large 96->192 k10 s5 (x32)", 96, 1, 200, 192, 1, 10, 1, 0, 3, 1, 1, 32, 5},
    {"large 192->384 k8 s4 (x32)", 192, 1, 40, 384, 1, 8, 1, 0, 2, 1, 1, 32, 4},
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Argument, optional: a part of the cases' names to run only those.
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  DeviceKernels& k = cpu_kernels();
  Generator gen(3, 0);
  bool all_same = true;
  double table_total = 0, column_total = 0;
  fmt::print("{:31} {:>23} {:>23} {:>23}\n", "case", "forward direct column", "input grad direct col",
             "weight grad direct col");
  for (const Case& c : kCases) {
    if (std::string(c.name).find(only) == std::string::npos) continue;
    ConvPlan p;
    p.n = c.n, p.c = c.c, p.h = c.h, p.w = c.w, p.kh = c.kh, p.kw = c.kw, p.sh = c.sh, p.sw = c.sw, p.ph = c.ph;
    p.pw = c.pw, p.dh = c.dh, p.dw = c.dw;
    p.oh = conv_output_size(p.h, p.kh, p.sh, p.ph, p.dh), p.ow = conv_output_size(p.w, p.kw, p.sw, p.pw, p.dw);
    const int64_t pos = p.oh * p.ow, ck = p.col_width();
    auto normal = [&](int64_t n) { return rand_normal({n}, gen).to_vector<float>(); };
    std::vector<float> x = normal(p.n * p.c * p.h * p.w), w = normal(c.cout * ck), g = normal(p.n * c.cout * pos);
    std::vector<float> cols(p.rows() * ck);
    std::vector<float> y(p.n * c.cout * pos), y_cols(y.size()), dx(x.size()), dx_cols(x.size());
    std::vector<float> dw(p.n * c.cout * ck), dw_cols(dw.size());
    const int reps = 30;
    const double t_fwd = bench::median_ms([&] { fixed_conv(p, x.data(), c.cout, w.data(), y.data()); }, reps);
    const double c_fwd = bench::median_ms([&] {
      k.im2col(x.data(), cols.data(), p);
      k.gemm_fixed(false, true, c.cout, pos, ck, w.data(), ck, cols.data(), ck, y_cols.data(), pos,
                   {p.n, 0, pos * ck, c.cout * pos});
    }, reps);
    const double t_data = bench::median_ms([&] { fixed_conv_data(p, c.cout, g.data(), w.data(), dx.data()); }, reps);
    const double c_data = bench::median_ms([&] {
      k.gemm_fixed(true, false, pos, ck, c.cout, g.data(), pos, w.data(), ck, cols.data(), ck,
                   {p.n, c.cout * pos, 0, pos * ck});
      k.col2im(cols.data(), dx_cols.data(), p);
    }, reps);
    const double t_weight = bench::median_ms([&] { fixed_conv_weight(p, x.data(), c.cout, g.data(), dw.data()); }, reps);
    const double c_weight = bench::median_ms([&] {
      k.im2col(x.data(), cols.data(), p);
      k.gemm_fixed(false, false, c.cout, ck, pos, g.data(), pos, cols.data(), ck, dw_cols.data(), ck,
                   {p.n, c.cout * pos, pos * ck, c.cout * ck});
    }, reps);
    bool ok = same(y, y_cols) && same(dx, dx_cols) && same(dw, dw_cols);
    const DirectConvPaths paths = direct_conv_paths(p);
    auto mark = [](bool direct) { return direct ? '*' : ' '; };
    fmt::print("{:31} {:>6.3f} {:>6.3f} ({:5.2f}){} {:>6.3f} {:>6.3f} ({:5.2f}){} {:>6.3f} {:>6.3f} ({:5.2f}){}{}\n", c.name,
               t_fwd, c_fwd, c_fwd / t_fwd, mark(paths.forward), t_data, c_data, c_data / t_data, mark(paths.data),
               t_weight, c_weight, c_weight / t_weight, mark(paths.weight), ok ? "" : "  BITS DIFFER");
    const double tab_fwd = bench::median_ms([&] { k.conv_fixed(x.data(), w.data(), nullptr, c.cout, y.data(), p); }, reps);
    const double tab_data =
        bench::median_ms([&] { k.conv_fixed_data(g.data(), w.data(), nullptr, c.cout, dx.data(), p); }, reps);
    const double tab_weight =
        bench::median_ms([&] { k.conv_fixed_weight(x.data(), g.data(), c.cout, dw.data(), nullptr, p); }, reps);
    fmt::print("{:31} table {:6.3f} {:6.3f} {:6.3f}\n", "", tab_fwd, tab_data, tab_weight);
    table_total += tab_fwd + tab_data + tab_weight;
    ok = ok && same(y, y_cols) && same(dx, dx_cols) && same(dw, dw_cols);  // the table's bits too
    all_same = all_same && ok;
    column_total += c_fwd + c_data + c_weight;
  }
  fmt::print("all cases, all three kernels: {:.3f} ms vs the column path's {:.3f} ms (ratio {:.2f}); bits {}\n",
             table_total, column_total, column_total / table_total, all_same ? "equal" : "DIFFER");
  return all_same ? 0 : 1;
}
