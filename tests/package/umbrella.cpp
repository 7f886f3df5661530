// The smallest program a user writes against the installed package: only
// the umbrella header, linked against the shared library. It quantizes a
// few rows with a VectorQuantize on one rank and prints what came out, so
// the test checks the library runs, not only that it links.
#include <vqddp/vqddp.h>

#include <cmath>
#include <cstdio>
#include <string>

int main() {
  using namespace vqddp;
  SingleCommunicator comm;
  Generator gen(7);
  VectorQuantizeOptions opt;
  opt.dim = 8;
  opt.codebook_size = 16;
  VectorQuantize vq(opt, gen);
  Tensor x = rand_normal({32, 8}, gen);
  auto out = vq.quantize(x, comm);
  std::printf("umbrella: quantized %lldx%lld, %lld indices, loss finite %d\n",
              static_cast<long long>(out.quantized.shape()[0]), static_cast<long long>(out.quantized.shape()[1]),
              static_cast<long long>(out.indices.numel()), std::isfinite(out.loss.item<float>()) ? 1 : 0);
  // A CUDA build's modules are found beside the installed library and load
  // against it (engine/cuda_module.h); "" means usable.
  const std::string cuda = cuda_unavailable_reason();
  std::printf("umbrella: cuda %s\n", cuda.empty() ? "usable" : cuda.c_str());
  return 0;
}
