// Audio read window by window while training (data/audio_windows.h,
// train/batch_prefetch.h): the order is the sampler's pure function, so a
// streamed run on W ranks is the 1-rank run bit for bit and resumes
// mid-epoch exactly; a file that changes under a run stops every rank
// naming it and the step.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "comm/errors.h"
#include "data/audio.h"
#include "data/audio_index.h"
#include "data/audio_windows.h"
#include "engine/core/file_io.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "train/batch_prefetch.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

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
  for (auto [depth, readers] : std::vector<std::pair<int, int>>{{0, 1}, {1, 1}, {3, 1}, {4, 3}}) {
    CAPTURE(depth);
    CAPTURE(readers);
    BatchPrefetcher batches(data, sampler, 2, s.total_steps, depth, readers);
    int64_t skipped = 0;
    for (int64_t step = 2; step < s.total_steps; ++step) {
      Tensor a = batches.take(step, skipped), b = read_rank_batch(data, sampler, step);
      REQUIRE(a.shape() == b.shape());
      CHECK(std::memcmp(a.raw_ptr(), b.raw_ptr(), a.nbytes()) == 0);
    }
  }
  BatchPrefetcher batches(data, sampler, 0, s.total_steps, 2);
  int64_t skipped = 0;
  CHECK_THROWS_WITH_AS(batches.take(1, skipped), doctest::Contains("step 2 asked for, step 1 due"), Error);
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
  o.after_step = [&](int64_t done, int rank, const CodecModel&, Optimizer&, const DiscriminatorState*) {
    if (done == 2 && rank == 0)
      std::call_once(cut, [&] {
        for (int i = 0; i < 10; ++i) std::filesystem::resize_file(dir.file(fmt::format("corpus/{:02}.wav", i)), 44 + 2 * 40);
      });
  };
  std::string message;
  bool agreed = false;
  try {
    train(cfg, data, o);
  } catch (const Error& e) {
    message = e.what();
    agreed = raised_by_every_rank(e);
  }
  CHECK(agreed);  // every rank stops with it, none at a collective's timeout
  CAPTURE(message);
  CHECK(message.find("reading this rank's batch") != std::string::npos);
  CHECK(message.find(dir.file("corpus/")) != std::string::npos);
  // Which check meets the cut depends on when it lands: before a read's
  // stat (size and time changed) or between the stat and the read (fewer
  // frames than the header said). Both name it; under ThreadSanitizer's
  // timing a prefetching reader met the second.
  CHECK((message.find(": changed since it was indexed") != std::string::npos ||
         message.find("shorter than when it was indexed, or cut short") != std::string::npos));
  CHECK(message.find("nothing after step") != std::string::npos);  // raised before anything is written
}

TEST_CASE("audio sources: a list and a JSONL manifest with segments and weights; bad lines are refused by line") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 4);  // 1200, 1370, 1540, 1710 samples at 16 kHz
  write_bytes(dir.file("list.txt"), "# clips\n corpus/00.wav \n\n" + dir.file("corpus/02.wav") + "\n");
  std::vector<AudioEntry> listed = list_audio_source(dir.file("list.txt"));
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].path == dir.file("corpus/00.wav"));
  CHECK(listed[1].path == dir.file("corpus/02.wav"));
  write_bytes(dir.file("m.jsonl"),
              "{\"path\": \"corpus/01.wav\", \"offset\": 0.01, \"duration\": 0.05}\n"
              "{\"path\": \"corpus/03.wav\", \"weight\": 2.5}\n"
              "{\"path\": \"corpus/00.wav\", \"weight\": 0.5}\n");
  std::vector<AudioEntry> entries = list_audio_source(dir.file("m.jsonl"));
  REQUIRE(entries.size() == 3);
  // At 8 kHz, frames of 16: 01 from sample 80 for 400 samples (25 windows);
  // 03 has 855 samples (53 windows) counted 2.5 times (133 rows); 00 has
  // 600 samples (37 windows) thinned to 19 rows (18.5 rounded away from 0).
  AudioWindows w(index_audio(entries, ""), 8000, 16);
  CHECK(w.clips()[0].first == 80);
  CHECK(w.clips()[0].windows == 25);
  CHECK(w.clips()[1].rows == 133);
  CHECK(w.clips()[2].windows == 37);
  CHECK(w.clips()[2].rows == 19);
  REQUIRE(w.rows() == 25 + 133 + 19);
  // Row 0 is 01.wav from 10 ms; row 25 + 53 is 03.wav's window 0 again.
  std::vector<float> a(16), b(16);
  w.read(0, a.data());
  read_audio_window(dir.file("corpus/01.wav"), 8000, 80, 16, b.data());
  CHECK(a == b);
  w.read(25, a.data());
  w.read(25 + 53, b.data());
  CHECK(a == b);
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"path\": \"x.wav\", \"weight\": 0}", "m.jsonl:2: 'weight' must be in (0, 1e6]"},
           {"{\"path\": \"x.wav\", \"gain\": 2}", "m.jsonl:2: unknown key 'gain'"},
           {"{\"offset\": 1}", "m.jsonl:2: 'path' is required"},
           {"[1]", "m.jsonl:2: a manifest line must be a JSON object"}}) {
    write_bytes(dir.file("m.jsonl"), "{\"path\": \"corpus/01.wav\"}\n" + text + "\n");
    CHECK_THROWS_WITH_AS(list_audio_source(dir.file("m.jsonl")), doctest::Contains(message.c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(list_audio_source(dir.file("corpus/00.wav")), doctest::Contains("is neither a directory"), Error);
}

TEST_CASE("the header index is cached, reused while files keep their size and time, and a changed file is refused") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 6);
  DataConfig c;
  c.sources = {{dir.file("corpus"), 1.0, ""}};
  c.frame = 16;
  c.holdout_every = 3;
  c.index_dir = dir.file("index");
  Dataset first = load_dataset(c);
  CHECK(first.description.find("0 of 6 headers from the index cache") != std::string::npos);
  Dataset second = load_dataset(c);
  CHECK(second.description.find("6 of 6 headers from the index cache") != std::string::npos);
  CHECK(data_fingerprint(first) == data_fingerprint(second));
  // Another source's index untouched for 40 days goes when this one is
  // rewritten; one of 20 days, and other files, stay.
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& [name, days] : std::vector<std::pair<std::string, int>>{
           {"index-00000000-old.jsonl", 40}, {"index-00000001-recent.jsonl", 20}, {"notes.txt", 400}}) {
    write_bytes(dir.file("index/" + name), "{}");
    std::filesystem::last_write_time(dir.file("index/" + name), now - std::chrono::hours(24 * days));
  }
  // A file rewritten (another length): its header is read again, the others reused.
  std::vector<float> longer(3000, 0.25f);
  write_audio(dir.file("corpus/01.wav"), longer, 16000, AudioEncoding::wav16);
  Dataset third = load_dataset(c);
  CHECK(third.description.find("5 of 6 headers from the index cache") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.file("index/index-00000000-old.jsonl")));
  CHECK(std::filesystem::exists(dir.file("index/index-00000001-recent.jsonl")));
  CHECK(std::filesystem::exists(dir.file("index/notes.txt")));
  std::filesystem::remove(dir.file("index/index-00000001-recent.jsonl"));
  std::filesystem::remove(dir.file("index/notes.txt"));
  CHECK(data_fingerprint(third) != data_fingerprint(first));
  // A cache that is not JSON is a cache, never an input: rebuilt.
  for (const auto& e : std::filesystem::directory_iterator(dir.file("index"))) write_bytes(e.path().string(), "{oops");
  CHECK(load_dataset(c).description.find("0 of 6 headers from the index cache") != std::string::npos);
  // The same bytes at another path (another node's mount) give the same fingerprint.
  std::filesystem::copy(dir.file("corpus"), dir.file("mounted"), std::filesystem::copy_options::recursive);
  DataConfig elsewhere = c;
  elsewhere.sources = {{dir.file("mounted"), 1.0, ""}};
  CHECK(data_fingerprint(load_dataset(elsewhere)) == data_fingerprint(third));
  // Changed after indexing, in place and at the same size: refused by name.
  std::vector<float> row(16);
  third.sources[0].read(0, row.data());
  {
    std::fstream f(dir.file("corpus/00.wav"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("\x7f\x7f", 2);
  }
  std::filesystem::last_write_time(dir.file("corpus/00.wav"),
                                   std::filesystem::last_write_time(dir.file("corpus/00.wav")) + std::chrono::seconds(5));
  CHECK_THROWS_WITH_AS(third.sources[0].read(0, row.data()),
                       doctest::Contains((dir.file("corpus/00.wav") + ": changed since it was indexed").c_str()), Error);
}

TEST_CASE("data.bad_files skip: unreadable rows are replaced alike on 1 and 3 ranks, and counted in the log") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 10);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("w1"));
  cfg.data.bad_files = "skip";
  cfg.data.index_dir = "off";
  cfg.schedule.steps = 6;
  Dataset data = load_dataset(cfg.data);
  std::filesystem::remove(dir.file("corpus/03.wav"));        // a training file gone
  std::filesystem::resize_file(dir.file("corpus/06.wav"), 600);  // one cut short
  std::filesystem::remove(dir.file("corpus/04.wav"));        // a held-out file gone
  TrainOptions logged;  // the metrics file is written where progress is printed
  cfg.distributed.world_size = 1;
  train(cfg, data, logged);
  cfg.run.dir = dir.file("w3");
  cfg.distributed.world_size = 3;
  train(cfg, data, logged);
  CHECK(bitwise_equal(safetensors_load(dir.file("w1/checkpoint.safetensors")).tensors,
                      safetensors_load(dir.file("w3/checkpoint.safetensors")).tensors));
  const std::string metrics = read_file(dir.file("w3/metrics.jsonl"));
  CHECK(metrics.find("\"skipped_rows\":") != std::string::npos);
  CHECK(metrics.find("\"validation_skipped_rows\":") != std::string::npos);
  CHECK(read_file(dir.file("w1/metrics.jsonl")) .find("\"skipped_rows\":") != std::string::npos);
  // Without skip, the same data stops the run.
  cfg.data.bad_files = "error";
  data.skip_bad_rows = false;
  cfg.run.dir = dir.file("strict");
  CHECK_THROWS_WITH_AS(train(cfg, data, quiet()), doctest::Contains("reading this rank's batch"), Error);
}

TEST_CASE("streamed audio: each rank reads only its own rows; an elastic resume mid-epoch (3 ranks, then 2) is exact") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 10);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("w1"));
  cfg.schedule.steps = 8;
  cfg.schedule.validate_every = 0;
  Dataset data = load_dataset(cfg.data);
  // Counts every training row read, whichever thread reads it.
  struct Counting final : ExampleSource {
    DataRows inner;
    mutable std::atomic<int64_t> reads{0};
    int64_t rows() const override { return inner.rows(); }
    int64_t dim() const override { return inner.dim(); }
    void read(int64_t row, float* out) const override {
      ++reads;
      inner.read(row, out);
    }
    uint32_t fingerprint(uint32_t crc) const override { return inner.fingerprint(crc); }
  };
  auto counting = std::make_shared<Counting>();
  counting->inner = data.sources[0];
  Dataset counted = data;
  counted.sources[0] = DataRows(counting);
  for (int world : {1, 3}) {
    CAPTURE(world);
    counting->reads = 0;
    cfg.distributed.world_size = world;
    cfg.run.dir = dir.file(fmt::format("count{}", world));
    train(cfg, counted, quiet());
    CHECK(counting->reads == 8 * 30);  // the global batches once, not once per rank
  }
  cfg.distributed.world_size = 1;
  cfg.run.dir = dir.file("straight");
  train(cfg, data, quiet());
  cfg.distributed.world_size = 3;
  cfg.run.dir = dir.file("elastic");
  TrainOptions first = quiet();
  first.stop_at_step = 4;  // an epoch is 15 steps: mid-epoch
  train(cfg, data, first);
  cfg.distributed.world_size = 2;
  TrainOptions second = quiet();
  second.resume = dir.file("elastic/checkpoint.safetensors");
  train(cfg, data, second);
  CHECK(bitwise_equal(safetensors_load(dir.file("straight/checkpoint.safetensors")).tensors,
                      safetensors_load(dir.file("elastic/checkpoint.safetensors")).tensors));
}
