#include "engine/cuda_module.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "vqddp_config.h"

namespace vqddp {

namespace {

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

std::string parent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The folders a module is looked for in, in order (cuda_module.h).
std::vector<std::string> module_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("VQDDP_MODULE_DIR"); env && *env) dirs.emplace_back(env);
  // The object this code was linked into: the program (an empty name in
  // its link map) or libvqddp.so.
  Dl_info info{};
  link_map* map = nullptr;
  std::string self;
  bool in_program = true;
  if (dladdr1(reinterpret_cast<void*>(&module_dirs), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) &&
      map && map->l_name && map->l_name[0] != '\0') {
    in_program = false;
    self = real_path(map->l_name);
  } else {
    self = real_path("/proc/self/exe");
  }
  const std::string build_root = VQDDP_BUILD_ROOT;
  const bool in_build = self.rfind(build_root + "/", 0) == 0;
  if (in_build) dirs.push_back(build_root);
  dirs.push_back(in_program ? parent(parent(self)) + "/" VQDDP_LIBDIR "/vqddp" : parent(self) + "/vqddp");
  dirs.emplace_back(VQDDP_MODULE_INSTALL_DIR);
  // Last, the build directory for programs outside it: a parent project
  // that builds vqddp as a meson subproject.
  if (!in_build) dirs.push_back(build_root);
  return dirs;
}

struct Loaded {
  void* handle = nullptr;
  std::string why;  // when handle is null
};

Loaded open_module(const std::string& name) {
  const std::string file = "libvqddp_" + name + ".so";
  std::vector<std::string> dirs = module_dirs();
  for (const std::string& dir : dirs) {
    const std::string path = dir + "/" + file;
    if (!is_file(path)) continue;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      const char* dl_error = dlerror();
      const std::string err = dl_error ? dl_error : "?";
      // A library not found is the usual case: a machine without the CUDA
      // runtime. Anything else (an undefined symbol) is the build's fault.
      const bool missing = err.find("cannot open shared object file") != std::string::npos;
      return {nullptr, fmt::format("{} could not be loaded: {}{}", path, err,
                                   missing ? fmt::format(" (is the CUDA runtime installed? this vqddp's cuda devices need "
                                                         "the CUDA toolkit's libcudart and libcublas{})",
                                                         name == "nccl" ? ", and NCCL" : "")
                                           : "")};
    }
    auto* build = static_cast<const char*>(dlsym(handle, "vqddp_module_build"));
    if (!build || std::strcmp(build, VQDDP_VERSION) != 0)
      return {nullptr, fmt::format("{} is another build's (vqddp {}; this program is vqddp {}): set VQDDP_MODULE_DIR "
                                   "to this build's modules",
                                   path, build ? build : "unknown", VQDDP_VERSION)};
    return {handle, ""};
  }
  return {nullptr, fmt::format("the CUDA module {} was not found (looked in {}; set VQDDP_MODULE_DIR to its folder)",
                               file, fmt::join(dirs, ", "))};
}

}  // namespace

void* cuda_module_entry(const std::string& name, const char* entry, std::string& why) {
  if (!VQDDP_HAVE_CUDA) {
    why = "this vqddp was built without CUDA (meson -Dcuda=enabled needs the CUDA toolkit at build time)";
    return nullptr;
  }
  static std::mutex mu;
  static std::map<std::string, Loaded>* loaded = new std::map<std::string, Loaded>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto get = [&](const std::string& n) -> const Loaded& {
    auto it = loaded->find(n);
    if (it == loaded->end()) it = loaded->emplace(n, open_module(n)).first;
    return it->second;
  };
  // The engine's module first: the others bind to its symbols.
  const Loaded& engine = get("cuda");
  const Loaded& module = name == "cuda" || !engine.handle ? engine : get(name);
  if (!module.handle) {
    why = module.why;
    return nullptr;
  }
  void* address = dlsym(module.handle, entry);
  if (!address) why = fmt::format("libvqddp_{}.so has no entry {}", name, entry);
  return address;
}

std::string cuda_modules_problem() {
  std::string why;
  for (const char* name : {"cuda", "cuda_vq", "nccl"}) {
    if (!VQDDP_HAVE_NCCL && std::strcmp(name, "nccl") == 0) continue;
    if (!cuda_module_entry(name, "vqddp_module_build", why)) return why;
  }
  return "";
}

}  // namespace vqddp
