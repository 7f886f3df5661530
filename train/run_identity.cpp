#include "train/run_identity.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "comm/agree.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "train/checkpoint.h"

namespace vqddp {

uint32_t build_fingerprint() {
  static const uint32_t fp = [] {
    Dl_info info{};
    // The object this function is in: the library, or the program it is linked into.
    VQDDP_CHECK(dladdr(reinterpret_cast<void*>(&build_fingerprint), &info) != 0 && info.dli_fname,
                "cannot tell which file holds this vqddp build (dladdr)");
    std::string path = info.dli_fname;
    if (path.empty() || path.find('/') == std::string::npos) path = "/proc/self/exe";
    const std::string bytes = read_file(path, kNoSizeLimit, "this vqddp build");
    return crc32c(bytes.data(), bytes.size());
  }();
  return fp;
}

uint32_t config_fingerprint(const nlohmann::json& config) {
  nlohmann::json keys = continuation_keys(config);
  if (keys["data"].is_object() && keys["data"].contains("sources") && keys["data"]["sources"].is_array())
    for (auto& source : keys["data"]["sources"])
      if (source.is_object()) source.erase("path");
  const std::string text = keys.dump();
  return crc32c(text.data(), text.size());
}

void agree_run_identity(Communicator& comm, uint32_t build, uint32_t config) {
  const std::vector<std::vector<int64_t>> all = gather_values(comm, {int64_t{build}, int64_t{config}});
  std::string builds, configs;
  for (int r = 1; r < comm.world_size(); ++r) {
    if (all[r][0] != all[0][0]) builds += fmt::format("{}rank {} runs {:08x}", builds.empty() ? "" : ", ", r, all[r][0]);
    if (all[r][1] != all[0][1]) configs += fmt::format("{}rank {} has {:08x}", configs.empty() ? "" : ", ", r, all[r][1]);
  }
  VQDDP_CHECK_EVERY_RANK(builds.empty(), "the ranks run different vqddp builds: rank 0 runs build {:08x}, and {} (CRC32C of the "
              "vqddp library or program each rank runs). Install the same build on every node", all[0][0], builds);
  VQDDP_CHECK_EVERY_RANK(configs.empty(), "the ranks run different configs: rank 0's has fingerprint {:08x}, and {} (CRC32C of "
              "model, quantizer, data, optimizer, batch size and seed). Give every node the same config",
              all[0][1], configs);
}

}  // namespace vqddp
