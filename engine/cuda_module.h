// Internal header: not installed.
//
// The CUDA code is not linked into vqddp's programs or its library: it
// lives in three modules, each linked against the CUDA libraries it needs
// and loaded on first use:
//   libvqddp_cuda.so     the engine's kernels (engine/cuda/): the first
//                        use of a cuda device, or cuda_device_count();
//   libvqddp_cuda_vq.so  the VQ kernels (vq/kernels/cuda/);
//   libvqddp_nccl.so     the NCCL backend (comm/nccl/).
// So a CUDA build that runs on CPUs maps no CUDA library (its memory is a
// CPU-only build's), and its binaries start on machines without the CUDA
// runtime, which a cuda device then names as missing.
//
// The modules leave the library's own symbols undefined: they bind to the
// program's (linked with -rdynamic, engine/meson.build) or to
// libvqddp.so's, so there is one copy of every global. Each is opened with
// RTLD_NOW | RTLD_GLOBAL, the engine's first: the other two use its streams.
//
// Where they are looked for, first found wins:
//   $VQDDP_MODULE_DIR;
//   the build directory, for a program or library inside it;
//   beside the code that asks: <dir of libvqddp.so>/vqddp, or, for a
//     program, <its dir>/../<libdir>/vqddp (so an installed tree may move);
//   <prefix>/<libdir>/vqddp as configured;
//   the build directory, for a program outside it (a meson parent project).
#pragma once

#include <string>

namespace vqddp {

// The address of `entry` in the module libvqddp_<name>.so, loading it on
// the first call (with the engine's module before it); nullptr when it
// cannot be loaded, with the reason in `why` (the module was not found, a
// CUDA library it needs is missing, it is another build's). Thread-safe;
// a module is loaded once and never unloaded.
void* cuda_module_entry(const std::string& name, const char* entry, std::string& why);

// What the entry function `entry` of libvqddp_<name>.so (no arguments,
// returning a T*) returns, or nullptr with the reason in `why`: how each
// layer reaches its module.
template <class T>
T* cuda_module_call(const std::string& name, const char* entry, std::string& why) {
  auto fn = reinterpret_cast<T* (*)()>(cuda_module_entry(name, entry, why));
  return fn ? fn() : nullptr;
}

// "" when every CUDA module of this build loads, else why the first does
// not. Asked when a run starts on a cuda device, so a missing library or
// symbol is named then, not at the first VQ kernel or collective.
std::string cuda_modules_problem();

}  // namespace vqddp
