// Checkpoints that defend themselves: a damaged or out-of-range checkpoint
// is refused with a message naming the file and the tensor (or metadata
// key), before the model or the optimizer changes; a good one still loads
// bit for bit.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>

#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "engine/core/safetensors.h"
#include "tests/engine/file_fixtures.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tests/vq/harness.h"
#include "train/checkpoint.h"
#include "train/model.h"

using namespace vqddp;
using vqddp::test::TempDir;
using vqddp::test::dead_pid;
using vqddp::test::safetensors_layout;
using vqddp::test::SafetensorsLayout;

namespace {

constexpr int64_t kSteps = 2;  // the trained run's schedule: its checkpoint holds step 2

// The checkpoint of a 2-step run of the small config (k-means run, codebooks
// updated and revived, Adam moments set), trained once per process.
const std::string& trained_checkpoint() {
  static TempDir dir;
  static const std::string path = [] {
    Config cfg = vqddp::test::small_config(dir.path().string());
    cfg.schedule.steps = kSteps;
    train(cfg, vqddp::test::synthetic_data(), vqddp::test::quiet());
    return dir.file("checkpoint.safetensors");
  }();
  return path;
}

// A model and optimizer as a run of the small config builds them, untrained.
struct FreshRun {
  explicit FreshRun(const nlohmann::json& overrides = nlohmann::json::object())
      : cfg(config(overrides)), model(cfg.model, cfg.quantizer, 16, cfg.run.seed), optim(model.parameters(), {}) {}
  static Config config(const nlohmann::json& overrides) {
    nlohmann::json j = vqddp::test::small_config("unused-run-dir").source;  // nothing is written there
    j.merge_patch(overrides);
    return parse_config(j, "test");
  }
  // The run's one trained part (train/trained_part.h), what checkpoints read and write.
  std::vector<TrainedPart> parts() { return codec_part(model, optim); }
  NamedTensors state() { return copies_on(checkpoint_tensors(parts()), Device::cpu()); }

  Config cfg;
  CodecModel model;
  AdamW optim;
};

// The trained checkpoint copied to `dir`, with tensor `name` replaced by
// `value` (checksums rewritten, so only the value is wrong).
std::string with_tensor(const TempDir& dir, const std::string& name, const Tensor& value) {
  SafetensorsFile f = safetensors_load(trained_checkpoint());
  REQUIRE(f.contains(name));
  for (auto& [n, t] : f.tensors)
    if (n == name) t = value;
  std::string path = dir.file("checkpoint.safetensors");
  safetensors_save(path, f.tensors, f.metadata);
  return path;
}

// `name` from the trained checkpoint with element `at` set to `v`.
Tensor edited(const std::string& name, int64_t at, double v) {
  Tensor t = safetensors_load(trained_checkpoint()).at(name).clone();
  if (t.dtype() == DType::i64) t.data<int64_t>()[at] = static_cast<int64_t>(v);
  else t.data<float>()[at] = static_cast<float>(v);
  return t;
}

// Loading `path` into a fresh run fails with a message containing
// `message` and changes no tensor of the model or optimizer.
void check_refused(const std::string& path, const std::string& message, int64_t total_steps = kSteps,
                   const nlohmann::json& overrides = nlohmann::json::object()) {
  FreshRun run(overrides);
  NamedTensors before = run.state();
  CHECK_THROWS_WITH_AS(load_checkpoint(path, run.parts(), total_steps, &run.cfg.source),
                       doctest::Contains(message.c_str()), Error);
  CHECK(vqddp::test::first_difference(before, run.state()) == "");
}


// A checkpoint's tensors without 'train.step': what the model and optimizer hold.
NamedTensors model_and_optimizer(const NamedTensors& stored) {
  NamedTensors out;
  for (const auto& [name, t] : stored)
    if (name != "train.step") out.emplace_back(name, t);
  return out;
}

}  // namespace

TEST_CASE("a good checkpoint loads bit-exactly, and saving it again writes the same bytes") {
  const std::string& path = trained_checkpoint();
  FreshRun run;
  SafetensorsFile stored = safetensors_load(path);
  CHECK(stored.checksummed);
  // Training changed the state: a fresh run's differs from the stored one (same tensors, other values).
  std::string changed = vqddp::test::first_difference(run.state(), model_and_optimizer(stored.tensors));
  CHECK(changed.find("]: ") != std::string::npos);  // a value differs ("'name'[i]: a vs b"), not names or shapes
  CHECK(load_checkpoint(path, run.parts(), kSteps, &run.cfg.source) == kSteps);
  NamedTensors loaded = run.state();
  loaded.emplace_back("train.step", stored.at("train.step"));
  CHECK(vqddp::test::first_difference(loaded, stored.tensors) == "");
  TempDir dir;
  save_checkpoint(dir.file("again.safetensors"), run.parts(), kSteps, kSteps, checkpoint_config(stored),
                  checkpoint_data_facts(stored));
  CHECK(read_file(dir.file("again.safetensors")) == read_file(path));
}

TEST_CASE("a truncated checkpoint is refused naming the file and the cut tensor") {
  TempDir dir;
  std::string bytes = read_file(trained_checkpoint());
  std::string path = dir.file("checkpoint.safetensors");
  SafetensorsLayout step = safetensors_layout(bytes, "train.step");
  REQUIRE(step.data_start + step.end == bytes.size());  // the step is written last
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  check_refused(path, fmt::format("{}: tensor 'train.step': data_offsets [{}, {}] pass the end of the data ({} bytes): "
                                  "file truncated?",
                                  path, step.begin, step.end, step.end - 3));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, 5);
  check_refused(path, fmt::format("{}: file of 5 bytes is too short for a safetensors header", path));
}

TEST_CASE("one flipped bit in a codebook is refused naming the file, the tensor and both checksums") {
  TempDir dir;
  const std::string name = "buffer.quantizer.layer0.embed";
  std::string bytes = read_file(trained_checkpoint());
  SafetensorsLayout l = safetensors_layout(bytes, name);
  size_t begin = l.data_start + l.begin, end = l.data_start + l.end;
  uint32_t stored = crc32c(bytes.data() + begin, end - begin);
  bytes[begin + 9] = static_cast<char>(bytes[begin + 9] ^ 0x04);
  uint32_t actual = crc32c(bytes.data() + begin, end - begin);
  std::string path = dir.file("checkpoint.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  check_refused(path, fmt::format("{}: tensor '{}' is damaged (checksum {:08x}, stored {:08x})", path, name, actual,
                                  stored));
}

TEST_CASE("a checksummed format whose checksums went missing is refused; an older unchecked format loads") {
  TempDir dir;
  SafetensorsFile f = safetensors_load(trained_checkpoint());
  std::string bytes = read_file(trained_checkpoint());
  // Rename the checksum key in place (same length): what a damaged header looks like.
  size_t at = bytes.find("vqddp.crc32c");
  REQUIRE(at != std::string::npos);
  bytes[at + 11] = 'd';
  // And the metadata's checksum, which the renamed key would otherwise fail.
  bytes.replace(bytes.find("vqddp.metadata_crc32c"), 21, "vqddp.unused_metadata");
  std::string path = dir.file("checkpoint.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  check_refused(path, fmt::format("{}: a vqddp-checkpoint/2 file must carry checksums but its __metadata__ has none: the "
                                  "header is damaged",
                                  path));
  // Format 1 was written before checksums: it loads, unverified.
  std::string old = dir.file("old.safetensors");
  bytes = read_file(trained_checkpoint());
  at = bytes.find("vqddp-checkpoint/2");
  REQUIRE(at != std::string::npos);
  bytes[at + 17] = '1';
  bytes.replace(bytes.find("vqddp.crc32c"), 12, "vqddp.unused");  // as an old file: no checksums
  bytes.replace(bytes.find("vqddp.metadata_crc32c"), 21, "vqddp.unused_metadata");
  std::ofstream(old, std::ios::binary) << bytes;
  FreshRun run;
  CHECK(load_checkpoint(old, run.parts(), kSteps, &run.cfg.source) == kSteps);
  CHECK(vqddp::test::first_difference(run.state(), model_and_optimizer(f.tensors)) == "");
}

TEST_CASE("train.step must be int64, not negative, and within the schedule, else the file and tensor are named") {
  TempDir dir;
  SUBCASE("negative") {
    std::string path = with_tensor(dir, "train.step", full({1}, -1, DType::i64));
    check_refused(path, fmt::format("{}: tensor 'train.step' holds -1: a step count cannot be negative", path));
  }
  SUBCASE("past the schedule") {
    std::string path = with_tensor(dir, "train.step", full({1}, kSteps + 1, DType::i64));
    check_refused(path, fmt::format("{}: tensor 'train.step' holds 3, past the 2 steps of this run's schedule", path));
  }
  SUBCASE("float64") {
    std::string path = with_tensor(dir, "train.step", full({1}, 2, DType::f64));
    check_refused(path, fmt::format("{}: tensor 'train.step' is float64[1], expected int64[1]", path));
  }
  SUBCASE("not one value") {
    std::string path = with_tensor(dir, "train.step", zeros({0}, DType::i64));
    check_refused(path, fmt::format("{}: tensor 'train.step' is int64[0], expected int64[1]", path));
  }
}

TEST_CASE("resuming training from a negative or huge step is an error, not a crash or an empty run") {
  TempDir dir, run_dir;
  Config cfg = vqddp::test::small_config(run_dir.path().string());
  cfg.schedule.steps = kSteps;
  TrainOptions resume = vqddp::test::quiet();
  for (int64_t step : {int64_t{-5}, int64_t{1000000000000000}}) {
    resume.resume = with_tensor(dir, "train.step", full({1}, static_cast<double>(step), DType::i64));
    CHECK_THROWS_WITH_AS(train(cfg, vqddp::test::synthetic_data(), resume),
                         doctest::Contains((resume.resume + ": tensor 'train.step' holds").c_str()), Error);
  }
}

TEST_CASE("codebook and optimizer counters out of their range are refused naming the tensor and the value") {
  TempDir dir;
  struct Case {
    std::string tensor;
    int64_t at;
    double value;
    std::string says;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Case& c : {
           Case{"buffer.quantizer.layer0.cluster_size", 3, -1, "-1 at index 3, outside [0, inf]"},
           Case{"buffer.quantizer.layer1.cluster_size", 0, nan, "nan at index 0, not finite"},
           Case{"buffer.quantizer.layer2.draws", 0, -1, "-1 at index 0, outside [0, inf]"},
           Case{"buffer.quantizer.dropout_step", 0, -7, "-7 at index 0, outside [0, inf]"},
           Case{"buffer.quantizer.layer0.initted", 0, 2, "2 at index 0, outside [0, 1]"},
           Case{"buffer.quantizer.layer1.embed_avg", 5, INFINITY, "inf at index 5, not finite"},
           Case{"optim.step.0", 0, -3, "-3 at index 0, outside [0, inf]"},  // AdamW's bias correction counts it
       }) {
    CAPTURE(c.tensor);
    std::string path = with_tensor(dir, c.tensor, edited(c.tensor, c.at, c.value));
    check_refused(path, fmt::format("{}: tensor '{}' holds {}", path, c.tensor, c.says));
  }
}

TEST_CASE("a codebook without k-means init must be initialised in the checkpoint") {
  TempDir dir;
  const nlohmann::json no_kmeans = {{"quantizer", {{"kmeans_init", false}}}};
  FreshRun source(no_kmeans);
  std::string path = dir.file("checkpoint.safetensors");
  save_checkpoint(path, source.parts(), 0, kSteps, source.cfg.source);
  SafetensorsFile f = safetensors_load(path);
  for (auto& [n, t] : f.tensors)
    if (n == "buffer.quantizer.layer1.initted") t = zeros({1}, DType::i64);
  safetensors_save(path, f.tensors, f.metadata);
  check_refused(path, fmt::format("{}: tensor 'buffer.quantizer.layer1.initted' holds 0 at index 0, outside [1, 1]", path),
                kSteps, no_kmeans);
}

TEST_CASE("a NaN parameter or optimizer moment is refused naming the tensor") {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::string path = with_tensor(dir, "param.encoder.0.weight", edited("param.encoder.0.weight", 5, nan));
  check_refused(path, fmt::format("{}: tensor 'param.encoder.0.weight' holds nan at index 5, not finite", path));
  path = with_tensor(dir, "optim.exp_avg_sq.0", edited("optim.exp_avg_sq.0", 1, -INFINITY));
  check_refused(path, fmt::format("{}: tensor 'optim.exp_avg_sq.0' holds -inf at index 1, not finite", path));
}

TEST_CASE("config metadata that is not JSON is refused naming the file and the key") {
  TempDir dir;
  SafetensorsFile f = safetensors_load(trained_checkpoint());
  f.metadata["config"] = "{\"model\": ";
  std::string path = dir.file("checkpoint.safetensors");
  safetensors_save(path, f.tensors, f.metadata);
  check_refused(path, path + ": __metadata__ 'config': not valid JSON at column 11: unexpected end of input");
}

TEST_CASE("a run removes the temporary a killed save left in its directory before it writes a checkpoint") {
  TempDir dir;
  std::string stale = dir.file(fmt::format("checkpoint.safetensors.tmp.{}.0badf00d", dead_pid()));
  std::ofstream(stale) << "half a checkpoint";
  Config cfg = vqddp::test::small_config(dir.path().string());
  cfg.schedule.steps = 1;
  train(cfg, vqddp::test::synthetic_data(), vqddp::test::quiet());
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(dir.file("checkpoint.safetensors")));
}
