// Audio read window by window while training (data/audio_windows.h,
// train/batch_prefetch.h): the order is the sampler's pure function, so a
// streamed run on W ranks is the 1-rank run bit for bit and resumes
// mid-epoch exactly; a file that changes under a run stops every rank
// naming it and the step.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "data/audio.h"
#include "data/audio_windows.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "train/batch_prefetch.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// `files` clips of tones and a little noise at 16 kHz, of different lengths.
void write_corpus(const std::string& dir, int files) {
  std::filesystem::create_directories(dir);
  Generator g(11, 0);
  for (int i = 0; i < files; ++i) {
    std::vector<float> s(static_cast<size_t>(1200 + 170 * i));
    for (size_t t = 0; t < s.size(); ++t)
      s[t] = 0.4f * std::sin(0.02f * static_cast<float>((i + 1) * t)) + 0.05f * (g.uniform() - 0.5f);
    write_audio(fmt::format("{}/{:02}.wav", dir, i), s, 16000, AudioEncoding::wav16);
  }
}

Config streamed_config(const std::string& corpus, const std::string& dir) {
  Config cfg = small_config(dir);
  cfg.data.sources = {{corpus, 1.0, ""}};
  cfg.data.frame = 16;
  cfg.data.sample_rate = 8000;  // every window resampled
  cfg.data.holdout_every = 5;
  return cfg;
}

}  // namespace

TEST_CASE("streamed audio: the prefetched batches are the sampler's rows, read in any order of threads") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 6);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("run"));
  Dataset data = load_dataset(cfg.data);
  std::vector<int64_t> sizes{data.sources[0].rows()};
  Schedule s = plan_schedule(sizes, data.weights, cfg.schedule);
  ShardedSampler sampler(s, sizes, 7, 1, 3);
  for (int depth : {0, 1, 3}) {
    CAPTURE(depth);
    BatchPrefetcher batches(data, sampler, 2, s.total_steps, depth);
    for (int64_t step = 2; step < s.total_steps; ++step) {
      Tensor a = batches.take(step), b = read_rank_batch(data, sampler, step);
      REQUIRE(a.shape() == b.shape());
      CHECK(std::memcmp(a.raw_ptr(), b.raw_ptr(), a.nbytes()) == 0);
    }
  }
  BatchPrefetcher batches(data, sampler, 0, s.total_steps, 2);
  CHECK_THROWS_WITH_AS(batches.take(1), doctest::Contains("step 2 asked for, step 1 due"), Error);
}

TEST_CASE("streamed audio: a whole run on 3 ranks is the 1-rank run bit for bit, and resumes mid-epoch exactly") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 10);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("w1"));
  Dataset data = load_dataset(cfg.data);
  cfg.schedule.steps = 7;
  cfg.distributed.world_size = 1;
  train(cfg, data, quiet());
  cfg.run.dir = dir.file("w3");
  cfg.distributed.world_size = 3;
  train(cfg, data, quiet());
  NamedTensors one = safetensors_load(dir.file("w1/checkpoint.safetensors")).tensors;
  CHECK(bitwise_equal(one, safetensors_load(dir.file("w3/checkpoint.safetensors")).tensors));
  // 8 steps of 30 from an epoch of 15 steps: the resume at step 4
  // is mid-epoch, with no loader state saved.
  Schedule s = plan_schedule({data.sources[0].rows()}, data.weights, cfg.schedule);
  REQUIRE(s.steps_per_epoch > 4);
  check_bit_exact_resume(cfg, data, dir.file("a"), dir.file("b"), 8);
}

TEST_CASE("streamed audio: a file cut during the run stops every rank, naming the file and the step") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 10);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("run"));
  Dataset data = load_dataset(cfg.data);
  cfg.schedule.steps = 12;
  cfg.schedule.validate_every = 0;  // the held-out files are read at the end only
  TrainOptions o = quiet();
  std::once_flag cut;
  o.after_step = [&](int64_t done, int rank, const CodecModel&, Optimizer&) {
    if (done == 2 && rank == 0)
      std::call_once(cut, [&] {
        for (int i = 0; i < 10; ++i) std::filesystem::resize_file(dir.file(fmt::format("corpus/{:02}.wav", i)), 44 + 2 * 40);
      });
  };
  std::string message;
  try {
    train(cfg, data, o);
  } catch (const Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("reading this rank's batch") != std::string::npos);
  CHECK(message.find(dir.file("corpus/")) != std::string::npos);
  CHECK(message.find("is shorter than when it was indexed, or cut short") != std::string::npos);
}
