// The main job's bits, pinned: examples/speech_codec.json trained for 30
// steps on 4 thread ranks must end in the checkpoint whose tensors'
// CRC-32Cs tests/train/golden/main_job_30_steps.txt lists. Every other test
// compares a run with another run (W ranks with 1, a resume with a straight
// run, sim with the CPU), which a change that moves both alike passes; this
// one makes any change of the product's bits a conscious commit that says
// why. The test never writes the golden file: when the bits differ it
// writes what it got to a file in the temporary directory and names it;
// accepting them is a command of its own (cp that file over the golden
// one) and a commit message that explains the change.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/file_io.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "train/checkpoint.h"
#include "train/config.h"

using namespace vqddp;

namespace {

// One line per tensor of the checkpoint, in file order: name, dtype, shape
// and the CRC-32C of its bytes (the metadata, which names the build and
// the time, is left out).
std::string digest(const SafetensorsFile& f) {
  std::string out;
  for (const auto& [name, t] : f.tensors) {
    Tensor c = t.clone();
    out += fmt::format("{} {} {} {:08x}\n", name, dtype_name(c.dtype()), shape_str(c.shape()),
                       crc32c(c.raw_data(), c.nbytes()));
  }
  for (const auto& [name, b] : f.bytes) out += fmt::format("{} u8 [{}] {:08x}\n", name, b.size(), crc32c(b.data(), b.size()));
  return out;
}

}  // namespace

TEST_CASE("golden: the main job's 30-step checkpoint on 4 thread ranks has the pinned bits") {
  // The release build pins the bits; the sanitized builds (the same
  // arithmetic: -ffp-contract=off everywhere) spend their time elsewhere.
  if (test::sanitized_build()) return;
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  const std::string root = src ? src : ".", golden = root + "/tests/train/golden/main_job_30_steps.txt";
  test::TempDir dir;
  Config cfg = load_config(root + "/examples/speech_codec.json");
  cfg.schedule.steps = 30;  // as `vqddp train --steps 30`
  cfg.run.dir = dir.path().string();
  REQUIRE(cfg.distributed.world_size == 4);
  train(cfg, load_dataset(cfg.data), test::quiet());
  const std::string got = digest(read_checkpoint(dir.file("checkpoint.safetensors")));
  std::stringstream want;
  want << std::ifstream(golden).rdbuf();
  if (got != want.str()) {
    const std::string wrote =
        (std::filesystem::temp_directory_path() / "vqddp-golden-main_job_30_steps.txt").string();
    std::ofstream(wrote) << got;
    INFO("the main job's bits changed: if that is meant, `cp " << wrote << " " << golden
                                                                << "` and say why in the commit");
    CHECK(got == want.str());
  }
}
