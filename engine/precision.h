// The precision of products: what the inputs of the engine's GEMMs and
// convolutions (matmul, the conv ops; not the quantizers' distance
// searches, whose code choice stays fp32) are rounded to before they are
// multiplied (run.precision, `train --precision`). fp32 (the default) multiplies float32 inputs; tf32 and bf16
// are the formats a GPU's tensor cores take, emulated: each operand, and in
// backward each incoming gradient, is rounded to the format first
// (engine/kernel_math.h's round_to_tf32 / round_to_bf16, one formula on the
// CPU, sim and cuda), and the products are accumulated in float32 by the
// same fixed-order kernels as fp32. So each output element still has one
// reduction order, whatever the batch, its split over ranks, the thread
// count or the CPU: W ranks == 1 rank holds within each precision, and sim
// and the CPU give the same bits. A tensor-core kernel would accumulate in
// its own order inside each instruction; these are not that kernel, and
// they are no faster than fp32 (the rounding is an extra pass).
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/tensor.h"

namespace vqddp {

enum class Precision : uint8_t { fp32, tf32, bf16 };

const char* precision_name(Precision p);  // "fp32", "tf32", "bf16"
// "fp32", "tf32", "bf16" -> Precision; throws naming `what` otherwise.
Precision parse_precision(const std::string& name, const std::string& what);

// The calling thread's precision of products (fp32 unless a scope set it).
Precision product_precision();

// Sets the calling thread's precision of products while it lives (a rank's
// thread, for its whole run: training steps and validation alike).
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision before_;
};

// `t` (float32) as a product's input in this thread's precision: `t`
// itself in fp32, else a rounded copy, detached (the products' autograd
// nodes keep their edges to `t`; a cast's gradient passes through).
Tensor product_input(const Tensor& t);

}  // namespace vqddp
