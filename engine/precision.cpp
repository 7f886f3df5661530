#include "engine/precision.h"

#include "engine/autograd.h"
#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

namespace {
thread_local Precision t_precision = Precision::fp32;
}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& what) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16})
    if (name == precision_name(p)) return p;
  VQDDP_THROW("{}: unknown precision '{}' (fp32, tf32 or bf16)", what, name);
}

Precision product_precision() { return t_precision; }

PrecisionScope::PrecisionScope(Precision p) : before_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = before_; }

Tensor product_input(const Tensor& t) {
  if (t_precision == Precision::fp32 || !t.defined()) return t;
  NoGradGuard no_grad;
  return t_precision == Precision::tf32 ? to_tf32(t.detach()) : to_bf16(t.detach());
}

}  // namespace vqddp
