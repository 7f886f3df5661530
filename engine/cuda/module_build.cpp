// Compiled into each CUDA module (engine/cuda_module.h): the vqddp version
// it belongs to, which the loader checks, so a program never binds to
// another build's module (its classes may differ).
#include "vqddp_config.h"

extern "C" {
__attribute__((visibility("default"))) extern const char vqddp_module_build[] = VQDDP_VERSION;
}
