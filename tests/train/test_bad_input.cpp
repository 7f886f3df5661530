// Bad input refused by name: counts read as 64 bits and range-checked
// (config keys and command-line flags), duplicate JSON keys, sizes whose
// product no tensor can hold, run directories that cannot take a run,
// metrics writes that fail, non-finite values traced to their origin, and a
// graceful stop on SIGTERM that resumes bit for bit.
#include <doctest/doctest.h>

#include "vq/fsq.h"
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "comm/errors.h"
#include "data/idx.h"
#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "engine/core/json_strict.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tool/cli_args.h"
#include "engine/core/count_limits.h"
#include "train/metrics_log.h"
#include "train/run_dir.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

using namespace vqddp;
using vqddp::test::TempDir;
using vqddp::test::quiet;
using vqddp::test::small_config;
using vqddp::test::synthetic_data;

namespace {

nlohmann::json base_config() { return {{"data", {{"sources", {{{"path", "x"}}}}}}}; }

void config_fails(const nlohmann::json& j, const std::string& what) {
  CAPTURE(j.dump());
  CHECK_THROWS_WITH_AS(parse_config(j, "run.json"), doctest::Contains(what.c_str()), Error);
}

// The CliArgs of `vqddp train ARGS...`.
CliArgs train_args(std::vector<std::string> words) {
  static std::vector<std::string> kept;
  kept = {"vqddp", "train"};
  kept.insert(kept.end(), words.begin(), words.end());
  static std::vector<char*> argv;
  argv.clear();
  for (std::string& w : kept) argv.push_back(w.data());
  return CliArgs("train", static_cast<int>(argv.size()), argv.data(), 2, {"world", "steps"});
}

// The message of the NonFiniteError `f` throws ("" and a failed check if none).
template <class F>
std::string nonfinite_message(F f) {
  try {
    f();
  } catch (const NonFiniteError& e) {
    return e.what();
  }
  FAIL_CHECK("no NonFiniteError was thrown");
  return "";
}

}  // namespace

TEST_CASE("counts in a config are 64-bit and range-checked: out of range is an error naming key and range") {
  nlohmann::json j = base_config();
  j["distributed"] = {{"world_size", 4294967298LL}};  // 2^32 + 2: was 2 ranks once cut to 32 bits
  config_fails(j, "run.json: 'distributed.world_size' must be in [1, 1024], got 4294967298");
  j = base_config();
  j["quantizer"] = {{"num_quantizers", 4294967297LL}};
  config_fails(j, "'quantizer.num_quantizers' must be in [1, 256], got 4294967297");
  j = base_config();
  j["quantizer"] = {{"codebook_dim", -3}};
  config_fails(j, "'quantizer.codebook_dim' must be in [0, 65536], got -3");
  j = base_config();
  j["quantizer"] = {{"type", "fsq"}, {"levels", {8, 2147483653LL}}};  // 2^31 + 5: was shown as -2147483643
  config_fails(j, "'quantizer.levels[1]' must be in [2, 65536], got 2147483653");
  j = base_config();
  j["schedule"] = {{"steps", -3}};
  config_fails(j, "'schedule.steps' must be in [0, 1099511627776], got -3");
  j = base_config();
  j["data"]["max_files"] = -1;
  config_fails(j, "'data.max_files' must be at least 0, got -1");
  j = base_config();
  j["distributed"] = {{"timeout_s", -1}};  // was blamed on world_size
  config_fails(j, "'distributed.timeout_s' must be in (0, 31536000] seconds, got -1");
  j = base_config();
  j["run"] = {{"dir", ""}};
  config_fails(j, "'run.dir' must name a directory, got \"\"");
  // A seed takes the whole unsigned 64-bit range (2^64 - 1 was called negative); below it is refused.
  j = base_config();
  j["run"] = {{"seed", std::numeric_limits<uint64_t>::max()}};
  CHECK(parse_config(j, "run.json").run.seed == std::numeric_limits<uint64_t>::max());
  j["run"] = {{"seed", -1}};
  config_fails(j, "'run.seed' must be an integer in [0, 2^64 - 1], got number -1");
  // An integer past int64 in the JSON text is a range error, not a wrapped value.
  CHECK_THROWS_WITH_AS(parse_config_text(R"({"data": {"sources": [{"path": "x"}]}, "schedule": {"batch_size": 18446744073709551615}})",
                                         "run.json"),
                       doctest::Contains("'schedule.batch_size' must be in [1, 16777216], got 18446744073709551615"),
                       Error);
}

TEST_CASE("sizes whose product no tensor can hold are refused by key before anything is allocated") {
  nlohmann::json j = base_config();
  j["quantizer"] = {{"codebook_size", 16777216}, {"codebook_dim", 65536}};
  config_fails(j, "'quantizer.codebook_size' gives codebook_size x codebook_dim x num_quantizers = "
                  "4398046511104 elements, more than the 2147483648 one tensor may hold");
  // Each type's reader checks its own tensors: SimVQ's frozen codebooks,
  // VQ's codebooks (each head's width when separate).
  j["quantizer"] = {{"type", "residual_sim_vq"}, {"codebook_size", 16777216}, {"frozen_codebook_dim", 64}};
  config_fails(j, "'quantizer.codebook_size' gives codebook_size x frozen_codebook_dim x layers = 4294967296 elements");
  j["quantizer"] = {{"type", "vq"}, {"codebook_size", 16777216}, {"codebook_dim", 256}};
  config_fails(j, "'quantizer.codebook_size' gives codebook_size x codebook_dim x codebooks = 4294967296 elements");
  j["quantizer"] = {{"type", "vq"}, {"codebook_size", 16777216}, {"codebook_dim", 64}, {"heads", 2},
                    {"separate_codebook_per_head", true}};
  CHECK_NOTHROW(parse_config(j, "run.json"));  // 2 codebooks of 2^24 x 64: 2^31 elements in all, 2^30 each
  j = base_config();
  j["model"] = {{"hidden", 65536}};
  config_fails(j, "'model.hidden' gives hidden x hidden = 4294967296 elements");
  // FSQ levels whose product overflowed gave -inf bits per example, then a random index error.
  j = base_config();
  j["quantizer"] = {{"type", "fsq"}, {"levels", {65536, 65536, 65536, 65536, 65536}}};
  config_fails(j, "'quantizer.levels' give an implicit codebook of more than 2^63 codes (their product), more than "
                  "the 16777216 codebook_size allows");
  j["quantizer"]["levels"] = {4096, 4097};
  config_fails(j, "implicit codebook of 16781312 codes");
  j["quantizer"]["levels"] = {4096, 4096};
  CHECK(parse_config(j, "run.json").quantizer.as<FSQOptions>().levels.size() == 2);
}

TEST_CASE("a key given twice in one JSON object is an error naming the key and its line") {
  CHECK_THROWS_WITH_AS(parse_config_text("{\n  \"optimizer\": {\"lr\": 0.1,\n  // a note\n  \"lr\": 0.2}\n}", "run.json"),
                       doctest::Contains("run.json: line 4: key \"lr\" appears twice in one object"), Error);
  // The same key in different objects is fine; so are comments.
  nlohmann::json j = parse_json_strict("{\"a\": {\"x\": 1}, /* c */ \"b\": [{\"x\": 2}, {\"x\": 3}]}", "t.json");
  CHECK(j["b"][1]["x"] == 3);
  CHECK_THROWS_WITH_AS(parse_json_strict("{\"a\": 1, \"b\": [1, 2], \"a\": 2}", "t.json"),
                       doctest::Contains("t.json: line 1: key \"a\" appears twice"), Error);
  CHECK_THROWS_WITH_AS(parse_json_strict("{\"a\": ", "t.json"), doctest::Contains("t.json: not valid JSON"), Error);
}

TEST_CASE("what is not a regular file is refused by every reader at once, naming it; sizes and nesting are bounded") {
  TempDir dir;
  // A FIFO with no writer: a blocking open would wait for ever.
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir.path().string()}) {
    CAPTURE(path);
    const std::string named = path + ": is ";
    CHECK_THROWS_WITH_AS(read_file(path), doctest::Contains(named.c_str()), Error);
    CHECK_THROWS_WITH_AS(load_config_json(path), doctest::Contains(named.c_str()), Error);
    CHECK_THROWS_WITH_AS(safetensors_load(path), doctest::Contains(named.c_str()), Error);
    CHECK_THROWS_WITH_AS(read_idx(path), doctest::Contains(named.c_str()), Error);
    CHECK_THROWS_WITH_AS(read_audio(path), doctest::Contains(named.c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(read_file(fifo), doctest::Contains("is a FIFO (named pipe), not a regular file"), Error);
  CHECK_THROWS_WITH_AS(read_file("/dev/zero"), doctest::Contains("is a character device, not a regular file"), Error);

  // A config bigger than its cap is refused before it is read.
  const std::string big = dir.file("big.json");
  std::ofstream(big).put('{');
  std::filesystem::resize_file(big, (int64_t{16} << 20) + 1);
  CHECK_THROWS_WITH_AS(load_config_json(big),
                       doctest::Contains((big + ": 16777217 bytes, more than the 16777216 bytes a config file may have").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(read_file(big, 100, "a test file"),
                       doctest::Contains("more than the 100 bytes a test file may have"), Error);

  // 200,000 nested brackets: an error naming the file and the line, not a
  // stack overflow. The limit itself is allowed.
  const std::string deep = "{\"a\":\n" + std::string(200000, '[') + std::string(200000, ']') + "}";
  CHECK_THROWS_WITH_AS(parse_json_strict(deep, "deep.json"),
                       doctest::Contains("deep.json: line 2: nesting deeper than 64 objects and arrays"), Error);
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  CHECK(parse_json_strict(ok, "ok.json").is_array());
  CHECK_THROWS_AS(parse_json_strict("[" + ok + "]", "ok.json"), Error);
  // The same in a safetensors header (inspect, resume, replay read one).
  const std::string header = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  write_file_atomic(dir.file("deep.safetensors"), file + header);
  CHECK_THROWS_WITH_AS(safetensors_load(dir.file("deep.safetensors")),
                       doctest::Contains("deep.safetensors: header: line 1: nesting deeper than 64"), Error);
}

TEST_CASE("command-line counts are 64-bit and range-checked: --world 4294967298 and --steps 0 are refused") {
  CHECK(train_args({"--world", "3"}).get_int("world", 1, limits::world) == 3);
  CHECK_THROWS_WITH_AS(train_args({"--world", "4294967298"}).get_int("world", 1, limits::world),
                       doctest::Contains("train: --world must be in [1, 1024], got 4294967298"), Error);
  CHECK_THROWS_WITH_AS(train_args({"--world=99999999999999999999"}).get_int("world", 1, limits::world),
                       doctest::Contains("train: --world must be in [1, 1024], got 99999999999999999999"), Error);
  CHECK_THROWS_WITH_AS(train_args({"--steps", "0"}).get_int("steps", 0, limits::steps),
                       doctest::Contains("train: --steps must be in [1, 1099511627776], got 0"), Error);
  CHECK_THROWS_WITH_AS(train_args({"--steps", "-3"}).get_int("steps", 0, limits::steps),
                       doctest::Contains("train: --steps must be in [1, 1099511627776], got -3"), Error);
  CHECK_THROWS_WITH_AS(train_args({"--steps", "3x"}).get_int("steps", 0, limits::steps),
                       doctest::Contains("train: --steps must be an integer, got '3x'"), Error);
  CHECK(train_args({}).get_int("steps", 7, limits::steps) == 7);  // the fallback is not range-checked: it is ours
}

TEST_CASE("--resume auto without a checkpoint (RunStart::unsaved) replaces only an unsaved metrics log, and refuses a "
          "checkpoint it did not see, removing nothing") {
  TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.file("run"));
  std::ofstream(dir.file("run/metrics.jsonl")) << "{\"step\": 5}\n";
  { RunDir ok(dir.file("run"), 1, RunStart::unsaved); }
  CHECK_FALSE(fs::exists(dir.file("run/metrics.jsonl")));  // steps never saved: replaced
  std::ofstream(dir.file("run/metrics.jsonl")) << "{\"step\": 10}\n";
  std::ofstream(dir.file("run/checkpoint.safetensors")) << "saved";
  CHECK_THROWS_WITH_AS(RunDir(dir.file("run"), 1, RunStart::unsaved),
                       doctest::Contains("--resume auto found no checkpoint.safetensors when it chose to start afresh, "
                                         "and now there is one"),
                       Error);
  CHECK(fs::exists(dir.file("run/checkpoint.safetensors")));
  CHECK(fs::exists(dir.file("run/metrics.jsonl")));
}

TEST_CASE("a run directory that cannot take the run is refused at start, naming it") {
  TempDir dir;
  std::ofstream(dir.file("plain")) << "x";
  CHECK_THROWS_WITH_AS(RunDir(dir.file("plain") + "/run", 1, RunStart::fresh),
                       doctest::Contains(fmt::format("run directory {}/run: cannot create it:", dir.file("plain")).c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(RunDir(dir.file("plain"), 1, RunStart::fresh), doctest::Contains("exists and is not a directory"), Error);
  CHECK_THROWS_WITH_AS(RunDir(dir.file("run"), int64_t{1} << 62, RunStart::fresh),
                       doctest::Contains("free, a checkpoint of this run needs 4398046511104.0 MiB"), Error);
  if (::geteuid() != 0) {  // root writes into a directory without write permission
    std::filesystem::create_directories(dir.file("ro"));
    std::filesystem::permissions(dir.file("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK_THROWS_WITH_AS(RunDir(dir.file("ro"), 1, RunStart::fresh), doctest::Contains("cannot write in it: Permission denied"),
                         Error);
    std::filesystem::permissions(dir.file("ro"), std::filesystem::perms::owner_all);
  }
  { RunDir ok(dir.file("run"), 1, RunStart::fresh); }
  // Only the lock file, which doubles as the write probe.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.file("run")), {}) == 1);
  CHECK(std::filesystem::exists(dir.file("run/.lock")));
  // A training run checks before its first step: nothing trained, nothing written.
  Config cfg = small_config(dir.file("plain") + "/run");
  std::atomic<int> steps = 0;  // every rank counts (none should)
  TrainOptions o = quiet();
  o.after_step = [&](const StepView&) { ++steps; };
  CHECK_THROWS_WITH_AS(train(cfg, synthetic_data(), o), doctest::Contains("cannot create it"), Error);
  CHECK(steps == 0);
}

TEST_CASE("a fresh run into a directory holding a run is refused on every rank, naming the ways on; the old run "
          "is kept, --overwrite replaces it") {
  TempDir dir;
  Config cfg = small_config(dir.file("run"));
  cfg.schedule.steps = 2;
  TrainOptions o = quiet();
  o.print = true;  // metrics.jsonl too
  train(cfg, synthetic_data(), o);
  std::string ckpt = read_file(dir.file("run/checkpoint.safetensors")), metrics = read_file(dir.file("run/metrics.jsonl"));
  int steps = 0;  // rank 0's
  o.after_step = [&](const StepView& v) { if (v.rank == 0) ++steps; };
  // Every rank throws rank 0's finding (comm/agree.h), not a timeout or an
  // abort of the others: the message carries "rank 0: " from the agreement.
  std::string expected = fmt::format("rank 0: run directory {} already holds a run (checkpoint.safetensors, "
                                     "metrics.jsonl); continue it with --resume {}/checkpoint.safetensors, start this "
                                     "run in another directory with --dir, or replace the old run with --overwrite",
                                     dir.file("run"), dir.file("run"));
  CHECK_THROWS_WITH_AS(train(cfg, synthetic_data(), o), doctest::Contains(expected.c_str()), Error);
  CHECK(steps == 0);
  CHECK(read_file(dir.file("run/checkpoint.safetensors")) == ckpt);  // nothing lost or mixed
  CHECK(read_file(dir.file("run/metrics.jsonl")) == metrics);
  o.overwrite = true;
  train(cfg, synthetic_data(), o);
  CHECK(steps == 2);
  auto lines = [](const std::string& text) { return std::count(text.begin(), text.end(), '\n'); };
  CHECK(lines(read_file(dir.file("run/metrics.jsonl"))) == lines(metrics));  // replaced, not appended to
}

TEST_CASE("a second run started into a directory while one runs there is refused by its lock, never interleaved") {
  TempDir dir;
  RunDir first(dir.file("run"), 1, RunStart::fresh);
  CHECK_THROWS_WITH_AS(RunDir(dir.file("run"), 1, RunStart::resume),
                       doctest::Contains(fmt::format("run directory {}: another run is writing to it (process {})",
                                                     dir.file("run"), ::getpid()).c_str()),
                       Error);
  // A whole training run refuses too, before its first step.
  Config cfg = small_config(dir.file("run"));
  std::atomic<int> steps = 0;  // every rank counts (none should)
  TrainOptions o = quiet();
  o.after_step = [&](const StepView&) { ++steps; };
  CHECK_THROWS_WITH_AS(train(cfg, synthetic_data(), o), doctest::Contains("another run is writing to it"), Error);
  CHECK(steps == 0);
}

TEST_CASE("a resume cuts metrics.jsonl back to the checkpoint's step, dropping cut-off lines") {
  TempDir dir;
  std::string path = dir.file("metrics.jsonl");
  std::ofstream(path) << "{\"step\":3,\"loss\":1}\n{\"step\":4,\"validation_mse\":1}\n{\"step\":6,\"loss\":1}\n{\"step\":9,\"lo";
  {
    MetricsLog log(path, 4);
    log.write({{"step", 5}});
  }
  CHECK(read_file(path) == "{\"step\":3,\"loss\":1}\n{\"step\":4,\"validation_mse\":1}\n{\"step\":5}\n");
  std::string kept = read_file(path);
  {
    MetricsLog log(path, -1);  // no resume: appends (the run directory has refused a fresh run over an old one)
    log.write({{"step", 1}});
  }
  CHECK(read_file(path) == kept + "{\"step\":1}\n");
  CHECK_THROWS_WITH_AS(MetricsLog(dir.file("no/such/metrics.jsonl"), -1),
                       doctest::Contains("no/such/metrics.jsonl: cannot open the metrics file for writing"), Error);
}

TEST_CASE("a metrics write that fails (full disk) is undone to the last whole line and counted") {
  TempDir dir;
  std::string path = dir.file("metrics.jsonl");
  MetricsLog log(path, -1);
  log.write({{"step", 1}});
  std::string before = read_file(path);
  // The file-size limit makes write() fail halfway through the line, as a full disk does.
  signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = before.size() + 10;
  setrlimit(RLIMIT_FSIZE, &small);
  log.write({{"step", 2}, {"loss", 0.123456789}, {"note", "longer than ten bytes"}});
  log.write({{"step", 3}, {"loss", 0.123456789}, {"note", "longer than ten bytes"}});
  setrlimit(RLIMIT_FSIZE, &saved);
  CHECK(log.lost() == 2);
  CHECK(read_file(path) == before);
  log.write({{"step", 4}});
  CHECK(read_file(path) == before + "{\"step\":4}\n");
}

TEST_CASE("a non-finite value in training names step and rank, and whether the data or a parameter holds it") {
  TempDir dir;
  // A learning rate that blows the weights up: the data are finite, the forward pass overflows.
  Config cfg = small_config(dir.file("lr"));
  cfg.optimizer.lr = 1e30f;
  cfg.optimizer.grad_clip = 0;
  TrainOptions o = quiet();
  o.checkpoints = false;
  CHECK_THROWS_WITH_AS(train(cfg, synthetic_data(), o),
                       doctest::Contains("the data batch and every parameter are finite, but the forward pass "
                                         "overflowed float32 (largest parameter value "),
                       NonFiniteError);
  // A parameter that became NaN is named.
  cfg = small_config(dir.file("nan-param"));
  std::string poisoned;
  o.after_step = [&](const StepView& v) {
    if (v.step != 2) return;
    auto [name, p] = v.codec.named_parameters().front();
    if (v.rank == 0) poisoned = name;
    p.fill_(std::nanf(""));
  };
  std::string m = nonfinite_message([&] { train(cfg, synthetic_data(), o); });
  CHECK(m.find(fmt::format("; the data batch is finite; parameter '{}' holds nan at index 0, not finite", poisoned)) !=
        std::string::npos);
  o.after_step = nullptr;
  // A NaN in the data is called what it is.
  Dataset data = synthetic_data();
  Tensor poisoned_rows = data.sources[0].read_range(0, data.sources[0].rows());
  poisoned_rows.fill_(std::nanf(""));
  data.sources[0] = poisoned_rows;
  cfg = small_config(dir.file("nan"));
  cfg.distributed.world_size = 1;
  m = nonfinite_message([&] { train(cfg, data, o); });
  CHECK(m.find("step 1, rank 0: ") != std::string::npos);
  CHECK(m.find("; the data batch itself holds a non-finite value (row ") != std::string::npos);
  // Both found alike by every rank (a reduced flag, a reduced loss), so an
  // MPI job ends without MPI_Abort: the context added on the way up keeps that.
  for (bool nan_data : {true, false}) {
    CAPTURE(nan_data);
    cfg = small_config(dir.file(nan_data ? "agreed-nan" : "agreed-lr"));
    if (!nan_data) cfg.optimizer.lr = 1e30f, cfg.optimizer.grad_clip = 0;
    bool agreed = false;
    try {
      train(cfg, nan_data ? data : synthetic_data(), o);
    } catch (const NonFiniteError& e) {
      agreed = raised_by_every_rank(e);
    }
    CHECK(agreed);
  }
}

TEST_CASE("SIGTERM mid-run: every rank finishes the same step, it is checkpointed, and the resume equals an "
          "uninterrupted run") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = small_config(dir.file("straight"));
  cfg.schedule.steps = 8;
  train(cfg, data, quiet());
  std::string straight = read_file(dir.file("straight") + "/checkpoint.safetensors");

  cfg.run.dir = dir.file("stopped");
  TrainOptions o = quiet();
  o.stop_requested = stop_signal_received;
  o.after_step = [](const StepView& v) {
    if (v.step == 3 && v.rank == 1) ::raise(SIGTERM);  // raise: delivered to this thread before it returns
  };
  TrainResult r;
  {
    StopSignalScope scope;
    r = train(cfg, data, o);
    CHECK(stop_signal_received() == SIGTERM);
  }
  CHECK(r.stopped_by == SIGTERM);
  CHECK(r.steps == 3);
  std::string ckpt = dir.file("stopped") + "/checkpoint.safetensors";
  CHECK(safetensors_load(ckpt).at("train.step").item<int64_t>() == 3);
  TrainOptions resume = quiet();
  resume.resume = ckpt;
  CHECK(train(cfg, data, resume).steps == 8);
  CHECK(read_file(ckpt) == straight);
}

TEST_CASE("a second SIGTERM stops the process at once; the same one delivered twice within a second does not") {
  int alive[2];
  REQUIRE(::pipe(alive) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    StopSignalScope scope;
    ::raise(SIGTERM);
    if (stop_signal_received() != SIGTERM) ::_exit(1);
    ::raise(SIGTERM);  // a scheduler's copy and the launcher's: one request
    if (::write(alive[1], "y", 1) != 1) ::_exit(1);  // still running
    ::usleep(1100000);
    ::raise(SIGTERM);
    ::_exit(2);  // not reached: the second request ends the process
  }
  ::close(alive[1]);
  char survived = 'n';
  CHECK(::read(alive[0], &survived, 1) == 1);
  ::close(alive[0]);
  CHECK(survived == 'y');
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
}

TEST_CASE("a run directory's .lock that is a link, a directory, a FIFO or a hard link is refused by name, and "
          "nothing outside the run is written") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("run"));
  std::ofstream(dir.file("victim")) << "precious";
  const std::string lock = dir.file("run/.lock");
  auto refused = [&](const char* what) {
    CHECK_THROWS_WITH_AS(RunDir(dir.file("run"), 1, RunStart::fresh),
                         doctest::Contains(fmt::format("run directory {}: {} is {}", dir.file("run"), lock, what).c_str()),
                         Error);
    std::filesystem::remove(lock);
  };
  std::filesystem::create_symlink(dir.file("victim"), lock);
  refused("a symbolic link");
  CHECK(read_file(dir.file("victim")) == "precious");  // not cut down to the pid
  std::filesystem::create_symlink(dir.file("made"), lock);  // dangling: nothing created outside the run
  refused("a symbolic link");
  CHECK_FALSE(std::filesystem::exists(dir.file("made")));
  std::filesystem::create_directory(lock);
  refused("a directory");
  REQUIRE(::mkfifo(lock.c_str(), 0644) == 0);
  refused("a FIFO");  // and the open did not block
  std::filesystem::create_hard_link(dir.file("victim"), lock);
  refused("a file with 2 hard links");
  CHECK(read_file(dir.file("victim")) == "precious");
  { RunDir ok(dir.file("run"), 1, RunStart::fresh); }
  // The reserve's name holding a directory is named, not taken for a full disk.
  std::filesystem::create_directories(dir.file("run/.reserve/sub"));
  CHECK_THROWS_WITH_AS(RunDir(dir.file("run"), 1, RunStart::fresh, true),
                       doctest::Contains(fmt::format("{}/.reserve is a directory, not the run's own reserve",
                                                     dir.file("run")).c_str()), Error);
  std::filesystem::remove_all(dir.file("run/.reserve"));
  {
    RunDir ok(dir.file("run"), 4096, RunStart::fresh, true);  // the reserve is held while the run lives
    CHECK(std::filesystem::file_size(dir.file("run/.reserve")) == 4096);
  }
  CHECK_FALSE(std::filesystem::exists(dir.file("run/.reserve")));
  // A run directory that is a link to nothing says so.
  std::filesystem::create_directory_symlink(dir.file("nowhere"), dir.file("dangling"));
  CHECK_THROWS_WITH_AS(RunDir(dir.file("dangling"), 1, RunStart::fresh),
                       doctest::Contains(fmt::format("is a symbolic link to {}, which does not exist",
                                                     dir.file("nowhere")).c_str()), Error);
}
