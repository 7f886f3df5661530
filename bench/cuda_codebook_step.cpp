// One EMA codebook training step and one eval step on cuda:0, against
// (1) a cuBLAS GEMM of the distance shape alone, in the same run, and
// (2) a plain PyTorch implementation of the same step (torch_ema_step.py,
//     run by this program when python3 with torch is there).
// Revival and k-means are off in both so the steady-state step is timed.
// Prints per shape: ms per step, the distance GEMM's achieved TFLOP/s
// (2 N K D / time), and the ratios. Without a GPU it says so and exits 0.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "bench/timing.h"
#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "vq/codebook.h"

using namespace vqddp;

namespace {

std::string torch_line(int64_t n, int64_t d, int64_t k, const std::string& script) {
  std::string cmd = fmt::format("python3 {} {} {} {} 2>/dev/null", script, n, d, k);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[256] = {0};
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

double field(const std::string& line, const std::string& key) {
  auto at = line.find(key + "=");
  return at == std::string::npos ? -1 : std::stod(line.substr(at + key.size() + 1));
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("cuda_codebook_step: no CUDA device (%s); nothing measured\n",
                cuda_built() ? "none on this machine" : "built without CUDA");
    return 0;
  }
  std::string script = argc > 1 ? argv[1] : "bench/torch_ema_step.py";
  const Device gpu = Device::cuda(0);
  DeviceKernels& kernels = device_kernels(gpu);
  SingleCommunicator comm;
  for (auto [n, d, k] : {std::tuple<int64_t, int64_t, int64_t>{65536, 256, 8192}, {16384, 256, 1024}}) {
    CodebookOptions o;
    o.codebook_size = k;
    o.dim = d;
    o.kmeans_init = false;
    o.threshold_ema_dead_code = 0.f;
    Generator gen(1, 0);
    Codebook book(o, gen);
    book.to(gpu);
    Tensor x = rand_normal({n, d}, gen).to(gpu);
    Tensor scores = empty({n, k}, DType::f32, gpu);
    auto sync = [&] { kernels.synchronize(); };
    auto step = [&] {
      book.forward(x, comm);
      sync();
    };
    auto gemm = [&] {
      kernels.gemm(false, true, n, k, d, 1.f, static_cast<const float*>(x.raw_ptr()), d,
                   static_cast<const float*>(book.embed.raw_ptr()), d, 0.f, static_cast<float*>(scores.raw_ptr()), k);
      sync();
    };
    auto fixed = [&] {
      kernels.gemm_fixed(false, true, n, k, d, static_cast<const float*>(x.raw_ptr()), d,
                         static_cast<const float*>(book.embed.raw_ptr()), d, static_cast<float*>(scores.raw_ptr()), k, {});
      sync();
    };
    step();  // warm-up: streams, handles, allocator
    gemm();
    fixed();
    double train_ms = bench::median_ms(step, 10);
    book.eval();
    double eval_ms = bench::median_ms(step, 10);
    double gemm_ms = bench::median_ms(gemm, 10);
    double fixed_ms = bench::median_ms(fixed, 10);
    double flop = 2.0 * n * k * d;
    fmt::print("N={} D={} K={}: batch-invariant GEMM {:.2f} ms ({:.1f} TFLOP/s), cuBLAS {:.2f} ms: {:.2f}x cuBLAS's speed\n",
               n, d, k, fixed_ms, flop / fixed_ms / 1e9, gemm_ms, gemm_ms / fixed_ms);
    fmt::print("N={} D={} K={}: train {:.2f} ms, eval {:.2f} ms, cuBLAS GEMM alone {:.2f} ms ({:.1f} TFLOP/s); "
               "eval/GEMM {:.2f}, train/GEMM {:.2f}, assign at {:.1f} TFLOP/s effective\n",
               n, d, k, train_ms, eval_ms, gemm_ms, flop / gemm_ms / 1e9, eval_ms / gemm_ms, train_ms / gemm_ms,
               flop / eval_ms / 1e9);
    std::string line = torch_line(n, d, k, script);
    double t_train = field(line, "train_ms"), t_eval = field(line, "eval_ms");
    if (t_train > 0)
      fmt::print("  PyTorch same step: train {:.2f} ms, eval {:.2f} ms; vqddp/PyTorch train {:.2f}, eval {:.2f}\n",
                 t_train, t_eval, train_ms / t_train, eval_ms / t_eval);
    else
      fmt::print("  PyTorch baseline not run (python3 with torch not found; script {})\n", script);
  }
  return 0;
}
