#include "engine/device.h"

#include "engine/counted_kernels.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/core/error.h"
#include "engine/cuda/module_entry.h"
#include "engine/cuda_module.h"
#include "engine/sim/sim_kernels.h"
#include "vqddp_config.h"

namespace vqddp {

std::string Device::str() const {
  switch (kind) {
    case Kind::cpu: return "cpu";
    case Kind::cuda: return fmt::format("cuda:{}", index);
    case Kind::sim: return fmt::format("sim:{}", index);
  }
  return "?";
}

Device parse_device(const std::string& text, const std::string& what) {
  auto colon = text.find(':');
  std::string kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    std::string digits = text.substr(colon + 1);
    bool ok = !digits.empty() && digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos;
    VQDDP_CHECK(ok && kind != "cpu", "{}: '{}' is not a device (cpu, cuda, cuda:N, sim, sim:N)", what, text);
    index = std::stoi(digits);
  }
  if (kind == "cpu") return Device::cpu();
  if (kind == "cuda") return Device::cuda(index);
  if (kind == "sim") return Device::sim(index);
  VQDDP_THROW("{}: '{}' is not a device (cpu, cuda, cuda:N, sim, sim:N)", what, text);
}

bool cuda_built() { return VQDDP_HAVE_CUDA; }

namespace {

// The engine's CUDA module (engine/cuda_module.h), loaded on the first
// call; null with the reason in `why` when it cannot be.
const CudaEngineEntry* cuda_engine(std::string& why) {
  static std::string reason;
  static const CudaEngineEntry* entry =
      cuda_module_call<const CudaEngineEntry>("cuda", "vqddp_cuda_engine_entry", reason);
  why = reason;
  return entry;
}

}  // namespace

std::string cuda_unavailable_reason() {
  std::string why;
  return cuda_engine(why) ? cuda_modules_problem() : why;
}

int cuda_device_count() {
  std::string why;
  const CudaEngineEntry* cuda = cuda_engine(why);
  return cuda ? cuda->device_count() : 0;
}

// The CPU's table is not counted (no launches there); every other device's
// is, by one rule (counted_kernels.h).
DeviceKernels& device_kernels(Device device) {
  if (device.kind == Device::Kind::sim) {
    static CountedKernels counted(sim_kernels(), false);  // the CPU's arithmetic counts its FLOPs
    return counted;
  }
  if (device.is_cpu()) return cpu_kernels();
  std::string why;
  const CudaEngineEntry* cuda = cuda_engine(why);
  VQDDP_CHECK(cuda, "device {} is not available: {}", device.str(), why);
  return *cuda->backend_for(device.index);
}

}  // namespace vqddp
