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

#include <sys/stat.h>

#include "comm/errors.h"
#include "data/audio.h"
#include "data/audio_index.h"
#include "data/audio_windows.h"
#include "engine/core/file_io.h"
#include "engine/core/shown.h"
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
  o.after_step = [&](const StepView& v) {
    if (v.step == 2 && v.rank == 0)
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
  // stat (size and time changed), between the stat and the read (fewer
  // frames than the header said), or inside the read (libsndfile decodes
  // fewer frames than asked: "the file is truncated, or changed since it
  // was indexed", met once in a fresh-machine run). All name it; under
  // ThreadSanitizer's timing a prefetching reader met the second.
  CHECK((message.find("changed since it was indexed") != std::string::npos ||
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
    write_bytes(dir.file("index/" + name), "{\"vqddp_audio_index\":2}\n");  // only our own caches are pruned
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

TEST_CASE("data.bad_files skip: a file whose header cannot be read is left out at the index and named; error refuses it") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 10);
  Config cfg = streamed_config(dir.file("corpus"), dir.file("run"));
  cfg.data.index_dir = "off";
  const uint32_t clean = data_fingerprint(load_dataset(cfg.data));
  // A header and no samples (Debian's ru_RU_f_IvrvoiceRU/is.wav is one), and
  // bytes that are not audio, sorted among the good files.
  std::string header = read_file(dir.file("corpus/00.wav")).substr(0, 44);
  header.replace(4, 4, std::string("\x24\0\0\0", 4));  // RIFF size 36
  header.replace(40, 4, std::string(4, '\0'));          // data size 0
  write_bytes(dir.file("corpus/03b.wav"), header);
  write_bytes(dir.file("corpus/07b.wav"), "not audio at all");
  cfg.data.bad_files = "error";
  CHECK_THROWS_WITH_AS(load_dataset(cfg.data), doctest::Contains((dir.file("corpus/03b.wav") + ": no samples").c_str()),
                       Error);
  cfg.data.bad_files = "skip";
  const Dataset skipped = load_dataset(cfg.data);
  CHECK(skipped.description.find("10 audio clips") != std::string::npos);
  CHECK(skipped.description.find("2 unreadable files left out") != std::string::npos);
  CHECK(skipped.description.find(dir.file("corpus/03b.wav") + ": no samples") != std::string::npos);
  CHECK(skipped.description.find(dir.file("corpus/07b.wav")) != std::string::npos);
  // The same clips, the same held-out split: the data of the clean corpus.
  CHECK(data_fingerprint(skipped) == clean);
  // A source with nothing readable is refused, naming it.
  std::filesystem::create_directories(dir.file("bad"));
  write_bytes(dir.file("bad/x.wav"), header);
  cfg.data.sources = {{dir.file("bad"), 1.0, ""}};
  CHECK_THROWS_WITH_AS(load_dataset(cfg.data), doctest::Contains("holds no readable audio files"), Error);
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

// Hostile data inputs (issue 59): each is refused naming the list, line or
// file in our words, or handled correctly.
namespace {

// The message `f` throws ("" when it does not throw).
template <typename F>
std::string thrown(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

DataConfig corpus_config(const std::string& source, const std::string& index_dir) {
  DataConfig c;
  c.sources = {{source, 1.0, ""}};
  c.frame = 16;
  c.holdout_every = 3;
  c.index_dir = index_dir;
  return c;
}

void age(const std::string& path, int days) {
  std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now() - std::chrono::hours(24 * days));
}

}  // namespace

TEST_CASE("the index cache prunes only its own files, never a user's index-* file, a link, or through a linked dir") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 6);
  std::filesystem::create_directories(dir.file("index"));
  const std::string ours = "{\"vqddp_audio_index\":2}\n";
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"index-old.html", "<html>"},
           {"index-2019.html", ours},                  // our first line, not our name
           {"index-0000000A-upper.jsonl", ours},       // our names are lower-case hex
           {"index-00000002-notes.jsonl", "notes\n"},  // our name, not our format
           {"index-00000003-stale.jsonl", ours}}) {    // ours: goes
    write_bytes(dir.file("index/" + name), text);
    age(dir.file("index/" + name), 40);
  }
  write_bytes(dir.file("target.jsonl"), ours);
  age(dir.file("target.jsonl"), 40);
  std::filesystem::create_symlink(dir.file("target.jsonl"), dir.file("index/index-00000004-link.jsonl"));
  load_dataset(corpus_config(dir.file("corpus"), dir.file("index")));
  CHECK(!std::filesystem::exists(dir.file("index/index-00000003-stale.jsonl")));
  for (const char* kept : {"index-old.html", "index-2019.html", "index-0000000A-upper.jsonl",
                           "index-00000002-notes.jsonl", "index-00000004-link.jsonl"}) {
    CAPTURE(kept);
    CHECK(std::filesystem::exists(std::filesystem::symlink_status(dir.file(std::string("index/") + kept))));
  }
  CHECK(std::filesystem::exists(dir.file("target.jsonl")));

  // Through a cache directory that is a symbolic link (with or without a
  // trailing slash) nothing is deleted; the cache still serves, and the
  // description says it was not pruned.
  std::filesystem::create_directories(dir.file("real"));
  write_bytes(dir.file("real/index-00000005-stale.jsonl"), ours);
  age(dir.file("real/index-00000005-stale.jsonl"), 40);
  std::filesystem::create_directory_symlink(dir.file("real"), dir.file("linked"));
  for (const std::string& index_dir : {dir.file("linked"), dir.file("linked") + "/"}) {
    CAPTURE(index_dir);
    const std::string first = load_dataset(corpus_config(dir.file("corpus"), index_dir)).description;
    CHECK(first.find("not pruned: it is a symbolic link") != std::string::npos);
    CHECK(std::filesystem::exists(dir.file("real/index-00000005-stale.jsonl")));
    CHECK(load_dataset(corpus_config(dir.file("corpus"), index_dir)).description.find("6 of 6 headers") !=
          std::string::npos);
    for (const auto& e : std::filesystem::directory_iterator(dir.file("real")))
      if (e.path().filename() != "index-00000005-stale.jsonl") std::filesystem::remove(e.path());
  }
}

TEST_CASE("manifest numbers are bounded before they are converted: 1e300 s, a weight past 1e6, NaN are refused by "
          "line and key") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 4);
  for (const auto& [entry, message] : std::vector<std::pair<std::string, std::string>>{
           {"\"offset\": 1e300", "m.jsonl:2: 'offset' must be in [0, 1e7] seconds, got 1e+300"},
           {"\"duration\": 1e300", "m.jsonl:2: 'duration' must be in (0, 1e7] seconds, got 1e+300"},
           {"\"duration\": -1", "m.jsonl:2: 'duration' must be in (0, 1e7] seconds, got -1"},
           {"\"offset\": -0.5", "m.jsonl:2: 'offset' must be in [0, 1e7] seconds, got -0.5"},
           {"\"weight\": 1000001", "m.jsonl:2: 'weight' must be in (0, 1e6], got 1000001"},
           {"\"weight\": \"2\"", "m.jsonl:2: 'weight' must be in (0, 1e6], got \"2\""},
           {"\"offset\": 1e999", "m.jsonl:2: "}}) {
    CAPTURE(entry);
    write_bytes(dir.file("m.jsonl"), "{\"path\": \"corpus/00.wav\"}\n{\"path\": \"corpus/01.wav\", " + entry + "}\n");
    CHECK_THROWS_WITH_AS(list_audio_source(dir.file("m.jsonl")), doctest::Contains(message.c_str()), Error);
  }
  // The windows themselves bound what they convert (a clip built in code,
  // not from a manifest): the offset's llround once wrapped to LLONG_MIN.
  AudioClip huge = audio_clip(dir.file("corpus/00.wav"));
  huge.offset = 1e300;
  huge.weight = 1e6;
  CHECK_THROWS_WITH_AS(AudioWindows({huge}, 8000, 16), doctest::Contains("offset 1e+300 s is not in [0, 1e+07] s"),
                       Error);
  huge.offset = 0;
  huge.frames = int64_t{1} << 60;  // a header (or a cache) that lies
  CHECK_THROWS_WITH_AS(AudioWindows({huge}, 8000, 16), doctest::Contains("more than 2^53"), Error);
}

TEST_CASE("a list's syntax, BOM, NUL, length and duplicates: each refused by line in our words, or read right") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 4);
  // A malformed JSONL line: the file, the line and the column, never
  // nlohmann's exception text.
  write_bytes(dir.file("m.jsonl"), "{\"path\": \"corpus/00.wav\"}\n\n{\"path\": corpus/01.wav}\n");
  std::string message = thrown([&] { list_audio_source(dir.file("m.jsonl")); });
  CAPTURE(message);
  CHECK(message.find(dir.file("m.jsonl") + ":3: not valid JSON at column 10: invalid literal") != std::string::npos);
  CHECK(message.find("json.exception") == std::string::npos);

  // A UTF-8 byte order mark starts a list as it starts a manifest.
  const std::string bom = "\xEF\xBB\xBF";
  write_bytes(dir.file("l.txt"), bom + "corpus/00.wav\ncorpus/01.wav\n");
  CHECK(list_audio_source(dir.file("l.txt"))[0].path == dir.file("corpus/00.wav"));
  write_bytes(dir.file("m.jsonl"), bom + "{\"path\": \"corpus/00.wav\"}\n");
  CHECK(list_audio_source(dir.file("m.jsonl"))[0].path == dir.file("corpus/00.wav"));

  // An escaped NUL would end the name the system opens (s8k.wav).
  write_bytes(dir.file("m.jsonl"), "{\"path\": \"corpus/00.wav\\u0000.txt\"}\n");
  CHECK_THROWS_WITH_AS(list_audio_source(dir.file("m.jsonl")),
                       doctest::Contains("m.jsonl:1: the path holds a NUL character after \"corpus/00.wav\""), Error);
  write_bytes(dir.file("l.txt"), std::string("corpus/00.wav\0.txt\n", 19));
  CHECK_THROWS_WITH_AS(list_audio_source(dir.file("l.txt")), doctest::Contains("l.txt:1: the path holds a NUL"), Error);

  // A 1 MB path: refused by line, and shown shortened, in one short line.
  write_bytes(dir.file("l.txt"), "corpus/00.wav\n" + std::string(1 << 20, 'a') + ".wav\n");
  message = thrown([&] { list_audio_source(dir.file("l.txt")); });
  CAPTURE(message.size());
  CHECK(message.find("l.txt:2: a path of ") != std::string::npos);
  CHECK(message.find("aaa…aaa") != std::string::npos);
  CHECK(message.size() < 600);
  // Cut between UTF-8 characters: é's two bytes stay whole (or go whole).
  CHECK(shown(std::string(99, 'x') + "é" + std::string(200, 'y')) == std::string(99, 'x') + "…" + std::string(100, 'y'));
  // Control characters are written out, never sent to the terminal.
  CHECK(shown(std::string("a\x1b[31mb\0c\n", 10)) == "a\\x1b[31mb\\x00c\\x0a");

  // A path listed twice, or one segment twice: refused naming both lines.
  write_bytes(dir.file("l.txt"), "corpus/00.wav\ncorpus/01.wav\n./corpus/00.wav\n");
  CHECK_THROWS_WITH_AS(list_audio_source(dir.file("l.txt")),
                       doctest::Contains((dir.file("l.txt") + ":3: " + dir.file("corpus/00.wav") +
                                          " is listed already on line 1").c_str()), Error);
  write_bytes(dir.file("m.jsonl"), "{\"path\": \"corpus/00.wav\", \"offset\": 0.01}\n"
                                   "{\"path\": \"corpus/00.wav\", \"offset\": 0.02}\n"
                                   "{\"path\": \"corpus/00.wav\", \"offset\": 0.01}\n");
  CHECK_THROWS_WITH_AS(list_audio_source(dir.file("m.jsonl")),
                       doctest::Contains("00.wav (from 0.01 s) is listed already on line 1"), Error);
  // ... and one file under two names (a link), naming both.
  std::filesystem::create_symlink(dir.file("corpus/00.wav"), dir.file("twin.wav"));
  write_bytes(dir.file("l.txt"), "corpus/00.wav\ncorpus/01.wav\ntwin.wav\n");
  CHECK_THROWS_WITH_AS(load_dataset(corpus_config(dir.file("l.txt"), "off")),
                       doctest::Contains((dir.file("corpus/00.wav") + " and " + dir.file("twin.wav") +
                                          " are the same file").c_str()), Error);
}

TEST_CASE("what a list names must be a regular file: a FIFO, /dev/zero, a link loop are named for what they are, "
          "never blocked on; a FIFO swapped in during a run too") {
  TempDir dir;
  write_corpus(dir.file("corpus"), 4);
  REQUIRE(::mkfifo(dir.file("pipe.wav").c_str(), 0600) == 0);
  std::filesystem::create_symlink(dir.file("loop.wav"), dir.file("loop.wav"));
  for (const auto& [entry, message] : std::vector<std::pair<std::string, std::string>>{
           {dir.file("pipe.wav"), "pipe.wav: is a FIFO (named pipe), not a regular file"},
           {"/dev/zero", "/dev/zero: is a character device, not a regular file"},
           {"/dev/urandom", "/dev/urandom: is a character device, not a regular file"},
           {dir.file("loop.wav"), "loop.wav: cannot open for reading: is a symbolic link loop"},
           {dir.file("gone.wav"), "gone.wav: cannot open for reading: does not exist"}}) {
    CAPTURE(entry);
    write_bytes(dir.file("l.txt"), "corpus/00.wav\ncorpus/01.wav\n" + entry + "\n");
    CHECK_THROWS_WITH_AS(load_dataset(corpus_config(dir.file("l.txt"), "off")), doctest::Contains(message.c_str()),
                         Error);
  }
  // A source that is a link loop, and a loop in a source directory.
  std::filesystem::create_symlink(dir.file("src"), dir.file("src"));
  CHECK_THROWS_WITH_AS(load_dataset(corpus_config(dir.file("src"), "off")),
                       doctest::Contains((dir.file("src") + "' is a symbolic link loop").c_str()), Error);
  std::filesystem::create_symlink(dir.file("corpus/loop.wav"), dir.file("corpus/loop.wav"));
  CHECK_THROWS_WITH_AS(load_dataset(corpus_config(dir.file("corpus"), "off")),
                       doctest::Contains("loop.wav is a symbolic link loop"), Error);
  std::filesystem::remove(dir.file("corpus/loop.wav"));

  // A clip's file swapped for a FIFO between reads: refused, not blocked on.
  Dataset data = load_dataset(corpus_config(dir.file("corpus"), "off"));
  std::vector<float> row(16);
  data.sources[0].read(0, row.data());
  std::filesystem::rename(dir.file("pipe.wav"), dir.file("corpus/00.wav"));
  CHECK_THROWS_WITH_AS(data.sources[0].read(0, row.data()),
                       doctest::Contains("00.wav: is a FIFO (named pipe), not a regular file"), Error);
}

TEST_CASE("the index cache cannot lie: an edited entry is a miss, and a file rewritten in place at another rate with "
          "its size and time restored is read again") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("c8k"));
  // Clips at 8 kHz, one list (so the mixed-rate message names the first).
  std::vector<float> tone(1600);
  for (size_t t = 0; t < tone.size(); ++t) tone[t] = 0.3f * std::sin(0.05f * static_cast<float>(t));
  for (int i = 0; i < 3; ++i) write_audio(dir.file(fmt::format("c8k/{}.wav", i)), tone, 8000, AudioEncoding::wav16);
  write_bytes(dir.file("c8k/list.txt"), "0.wav\n1.wav\n2.wav\n");
  DataConfig c = corpus_config(dir.file("c8k/list.txt"), dir.file("index"));
  c.holdout_every = 3;
  const Dataset honest = load_dataset(c);
  const int64_t rows = honest.sources[0].rows();
  std::string cache;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("index"))) cache = e.path().string();
  // An entry edited to claim fewer frames: a miss, read again.
  std::string text = read_file(cache);
  const size_t at = text.find("\"frames\":1600");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"frames\":160");
  write_bytes(cache, text);
  const Dataset after_edit = load_dataset(c);
  CHECK(after_edit.description.find("2 of 3 headers from the index cache") != std::string::npos);
  CHECK(after_edit.sources[0].rows() == rows);

  // 1.wav rewritten at 16 kHz: the same size, its time set back.
  const auto mtime = std::filesystem::last_write_time(dir.file("c8k/1.wav"));
  write_audio(dir.file("c8k/1.wav"), tone, 16000, AudioEncoding::wav16);
  std::filesystem::last_write_time(dir.file("c8k/1.wav"), mtime);
  const std::string expected = dir.file("c8k/1.wav") + ": sample rate 16000 Hz differs from the 8000 Hz of " +
                               dir.file("c8k/0.wav") + " (set";
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains(expected.c_str()), Error);
  c.index_dir = "off";
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains(expected.c_str()), Error);

  // The same rewrite while a run reads: the header is checked at each read.
  std::vector<float> row(16);
  write_audio(dir.file("c8k/1.wav"), tone, 8000, AudioEncoding::wav16);
  std::filesystem::last_write_time(dir.file("c8k/1.wav"), mtime);
  const Dataset running = load_dataset(c);
  running.sources[0].read(rows - 1, row.data());  // 1.wav's last window
  write_audio(dir.file("c8k/1.wav"), tone, 16000, AudioEncoding::wav16);
  std::filesystem::last_write_time(dir.file("c8k/1.wav"), mtime);
  CHECK_THROWS_WITH_AS(running.sources[0].read(rows - 1, row.data()),
                       doctest::Contains("1.wav: changed since it was indexed: its header says 16000 Hz"), Error);
}
