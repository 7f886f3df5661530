// The training layer: schedule agreement, global-batch gradients, bit-exact
// resume, atomic checkpoints, check-ddp on the shipped examples and on a
// broken variant, config errors, and the choice of device (run.device).
#include <map>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/errors.h"
#include "comm/thread_group.h"
#include "engine/device.h"
#include "engine/core/file_io.h"
#include "engine/ops.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tests/vq/harness.h"
#include "tool/check_ddp.h"
#include "tool/default_config.h"
#include "train/checkpoint.h"
#include "train/ddp.h"
#include "tool/inspect.h"
#include "train/schedule.h"
#include "train/run_identity.h"
#include "train/trainer.h"

using namespace vqddp;
using vqddp::test::TempDir;
using vqddp::test::quiet;
using vqddp::test::small_config;
using vqddp::test::synthetic_data;

TEST_CASE("invariant 7: the schedule is identical on every rank when sampler weights differ in the last float bit") {
  std::vector<int64_t> sizes{101, 100};  // 201 examples, weights 1:1 -> shares 100.5 each: a tie
  ScheduleConfig c;
  c.batch_size = 20;
  c.epochs = 3;
  c.validate_every = 7;
  // On their own, drifted weights already split the epoch differently.
  Schedule up = plan_schedule(sizes, {1.0, std::nextafter(1.0, 2.0)}, c);
  Schedule down = plan_schedule(sizes, {std::nextafter(1.0, 2.0), 1.0}, c);
  CHECK(up.per_source != down.per_source);
  std::vector<Schedule> seen(4);
  run_ranks(4, [&](Communicator& comm) {
    double drift = comm.rank() % 2 ? std::nextafter(1.0, 2.0) : std::nextafter(1.0, 0.0);
    seen[comm.rank()] = agree_schedule(sizes, {1.0, drift}, c, comm, 42);
  }, vqddp::test::kFast);
  for (int r = 1; r < 4; ++r) CHECK(seen[r] == seen[0]);
  CHECK(seen[0].total_steps == 3 * (201 / 20));
  CHECK(seen[0].per_source[0] + seen[0].per_source[1] == 201);
}

TEST_CASE("invariant 7: ranks that loaded different data with the same total all stop with one error naming them") {
  // The data fingerprint tells apart what the example counts cannot: the
  // same 105 examples split 70 + 35 or 35 + 70, or one value changed.
  Dataset a = vqddp::test::synthetic_data(), swapped = a, changed = a;
  std::swap(swapped.sources[0], swapped.sources[1]);
  Tensor values = changed.sources[1].read_range(0, changed.sources[1].rows());
  values.data<float>()[17] += 1.0f;
  changed.sources[1] = values;
  CHECK(data_fingerprint(a) == data_fingerprint(vqddp::test::synthetic_data()));
  CHECK(data_fingerprint(a) != data_fingerprint(swapped));
  CHECK(data_fingerprint(a) != data_fingerprint(changed));
  ScheduleConfig c;
  c.batch_size = 20;
  std::vector<std::string> seen(3);
  run_ranks(3, [&](Communicator& comm) {
    const Dataset& mine = comm.rank() == 2 ? swapped : a;
    std::vector<int64_t> sizes{mine.sources[0].rows(), mine.sources[1].rows()};
    try {
      agree_schedule(sizes, {1.0, 1.0}, c, comm, data_fingerprint(mine));
    } catch (const Error& e) {
      seen[comm.rank()] = e.what();
      CHECK(raised_by_every_rank(e));  // MPI ends each process without MPI_Abort
    }
  }, vqddp::test::kFast);
  for (int r = 0; r < 3; ++r)
    CHECK(seen[r].find("the ranks loaded different data: rank 0 has 105 examples in 2 sources, and these ranks differ "
                       "from it: rank 2 (105 examples in 2 sources)") != std::string::npos);
}

TEST_CASE("invariant 7: a rank with another build or config stops every rank at the start, naming both fingerprints") {
  // The config fingerprint leaves data paths out (one data set may be
  // mounted elsewhere on another node; the data fingerprint compares it)
  // and sees every key a run's bits depend on.
  nlohmann::json a = small_config("/tmp/unused").source, moved = a, other = a;
  moved["data"]["sources"][0]["path"] = "/elsewhere";
  other["optimizer"]["lr"] = 0.004;
  CHECK(config_fingerprint(moved) == config_fingerprint(a));
  CHECK(config_fingerprint(other) != config_fingerprint(a));
  for (bool build : {true, false}) {
    std::vector<std::string> seen(3);
    CHECK_THROWS(run_ranks(3, [&](Communicator& comm) {
      const uint32_t mine = comm.rank() == 2 ? 9u : 7u;
      try {
        agree_run_identity(comm, build ? mine : 1u, build ? 1u : mine);
      } catch (const Error& e) {
        seen[comm.rank()] = e.what();
        CHECK(raised_by_every_rank(e));
        throw;
      }
    }));
    for (const std::string& m : seen)
      CHECK(m.find(build ? "the ranks run different vqddp builds: rank 0 runs build 00000007, and rank 2 runs 00000009"
                         : "the ranks run different configs: rank 0's has fingerprint 00000007, and rank 2 has 00000009") !=
            std::string::npos);
  }
}

TEST_CASE("invariant 7: a rank that runs one step more gets a clear error, not a hang") {
  CHECK_THROWS_WITH_AS(run_ranks(3, [&](Communicator& comm) {
                         Generator g(1, 0);  // one per rank: generators are not shared across threads
                         Linear lin(4, 2, g);
                         DistributedDataParallel ddp(lin, comm);
                         int64_t steps = comm.rank() == 1 ? 6 : 5;  // the drift
                         for (int64_t s = 0; s < steps; ++s) {
                           sum(lin(ones({2, 4}))).backward();
                           ddp.all_reduce_gradients();
                         }
                       }, {.timeout = std::chrono::milliseconds(2000)}),
                       doctest::Contains("returned without calling all_reduce(sum)"), DesyncError);
}

TEST_CASE("invariant 7 on resume: ranks that would start at different steps all fail, naming the steps") {
  std::vector<std::string> errors(3);
  std::vector<int64_t> agreed(3, -1);
  run_ranks(3, [&](Communicator& comm) {
    agreed[comm.rank()] = agree_start_step(40, comm);  // alike: fine
    try {
      agree_start_step(comm.rank() == 2 ? 50 : 40, comm);
    } catch (const Error& e) {
      errors[comm.rank()] = e.what();
    }
  }, vqddp::test::kFast);
  CHECK(agreed == std::vector<int64_t>(3, 40));
  for (const std::string& e : errors) CHECK(e.find("ranks start at different steps (40 to 50") != std::string::npos);
}

TEST_CASE("sharded sampler: ranks take disjoint contiguous shares of the same global batch, per epoch a new order") {
  std::vector<int64_t> sizes{10, 6};
  ScheduleConfig c;
  c.batch_size = 7;
  c.epochs = 2;
  Schedule s = plan_schedule(sizes, {1, 1}, c);
  REQUIRE(s.steps_per_epoch == 2);  // 16 examples, drop_last
  ShardedSampler whole(s, sizes, 5, 0, 1);
  std::vector<std::pair<int, int64_t>> joined;
  for (int r = 0; r < 3; ++r) {
    ShardedSampler part(s, sizes, 5, r, 3);
    CHECK(part.shard_sizes() == std::vector<int64_t>{3, 2, 2});
    auto b = part.rank_batch(1);
    joined.insert(joined.end(), b.begin(), b.end());
  }
  CHECK(joined == whole.rank_batch(1));
  CHECK(whole.rank_batch(0) != whole.rank_batch(2));  // epoch 2 reshuffles
  c.drop_last = false;
  CHECK(plan_schedule(sizes, {1, 1}, c).steps_per_epoch == 3);  // the last batch wraps around
}

TEST_CASE("sharded sampler: the order is a pure function of (seed, step, position); an epoch takes every row once before any twice") {
  // Source 0 gives 3 slots of its 10 rows per epoch; source 1, weighted up,
  // 25 slots of its 6 rows (4 passes and a bit over them).
  std::vector<int64_t> sizes{10, 6};
  ScheduleConfig c;
  c.batch_size = 4;
  c.epochs = 3;
  Schedule s = plan_schedule(sizes, {1, 8}, c);
  REQUIRE(s.per_source == std::vector<int64_t>{2, 14});
  REQUIRE(s.steps_per_epoch == 4);
  ShardedSampler a(s, sizes, 9, 0, 1);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::map<std::pair<int, int64_t>, int> count;
    for (int64_t p = 0; p < s.epoch_examples; ++p) ++count[a.example_at(epoch, p)];
    int from0 = 0;
    for (const auto& [ex, n] : count) {
      CHECK(ex.second < sizes[ex.first]);
      if (ex.first == 0) {
        CHECK(n == 1);  // 2 of 10 rows: no row twice
        from0 += n;
      } else {
        CHECK((n == 2 || n == 3));  // 14 slots over 6 rows: every row twice, two of them a third time
      }
    }
    CHECK(from0 == 2);
  }
  // Step k from a sampler that never saw steps 0..k-1 (a resumed run), and
  // from another rank count's shares, is the same.
  std::vector<std::vector<std::pair<int, int64_t>>> steps;
  for (int64_t k = 0; k < s.total_steps; ++k) steps.push_back(a.rank_batch(k));
  for (int64_t k : {11, 5, 0, 7}) {
    ShardedSampler fresh(s, sizes, 9, 0, 1);
    CHECK(fresh.rank_batch(k) == steps[k]);
    std::vector<std::pair<int, int64_t>> joined;
    for (int r = 0; r < 3; ++r) {
      auto b = ShardedSampler(s, sizes, 9, r, 3).rank_batch(k);
      joined.insert(joined.end(), b.begin(), b.end());
    }
    CHECK(joined == steps[k]);
  }
  CHECK(ShardedSampler(s, sizes, 10, 0, 1).rank_batch(0) != steps[0]);  // the seed matters
  CHECK(steps[0] != steps[4]);  // each epoch its own order
}

TEST_CASE("global-batch gradient: W ranks with uneven shards equal 1 rank on the whole batch") {
  // FSQ (no codebook state), residual VQ (k-means init, EMA, commitment
  // losses weighted per rank) and learnable residual VQ (its codebooks are
  // parameters, kept equal across ranks only by this reduction): the first
  // step's gradients of every parameter.
  for (const std::string type : {"fsq", "residual_vq", "learnable"}) {
  CAPTURE(type);
  bool learnable = type == "learnable";
  Config cfg = small_config("unused", learnable ? "residual_vq" : type);
  if (type != "fsq") test::set_quantizer_keys(cfg, {{"learnable_codebook", learnable}, {"quantize_dropout", false}});
  Dataset data = synthetic_data();
  Tensor x = data.sources[0].read_range(0, 23);  // 23 rows: shards 8, 8, 7
  std::vector<NamedTensors> grads(3);
  NamedTensors reference;
  for (int w : {1, 3}) {
    run_ranks(w, [&](Communicator& comm) {
      CodecModel model(cfg.model, cfg.quantizer, 16, 1);
      DistributedDataParallel ddp(model, comm);
      std::vector<int64_t> sizes = even_shards(23, w);
      Tensor mine = vqddp::test::shard(x, sizes, comm.rank());
      ModelOutput out = model.forward(mine, comm);
      mul(add(out.reconstruction_loss, out.quantizer_loss), DistributedDataParallel::loss_scale(mine.size(0), 23))
          .backward();
      ddp.all_reduce_gradients();
      NamedTensors g;
      for (auto& [n, p] : model.named_parameters()) g.emplace_back(n, p.grad().clone());
      (w == 1 ? reference : grads[comm.rank()]) = g;
    }, vqddp::test::kFast);
  }
  for (int r = 0; r < 3; ++r) {
    CHECK(vqddp::test::bitwise_equal(grads[r], grads[0]));
    vqddp::test::check_close(grads[r], reference, 1e-4, 1e-6);
  }
  }
}

TEST_CASE("broadcast_parameters: ranks built from different seeds all end with rank 0's parameters and buffers") {
  Config cfg = small_config("unused", "residual_vq");
  std::vector<NamedTensors> state(3), buffers_of(3);
  run_ranks(3, [&](Communicator& comm) {
    // Each rank its own seed (the parameters differ) and its own buffer
    // values (a fresh codebook's are the same on every seed).
    CodecModel model(cfg.model, cfg.quantizer, 16, 10 + static_cast<uint64_t>(comm.rank()));
    for (auto& [name, t] : model.named_buffers()) t.fill_(comm.rank() + 1.0);
    NamedTensors before = model.state_copy();
    broadcast_parameters(model, comm);
    NamedTensors after = model.state_copy();
    if (comm.rank() == 0) CHECK(vqddp::test::bitwise_equal(after, before));
    if (comm.rank() != 0) CHECK_FALSE(vqddp::test::bitwise_equal(after, before));
    NamedTensors buffers = model.named_buffers();
    for (auto& [name, t] : buffers) t = t.clone();
    buffers_of[static_cast<size_t>(comm.rank())] = buffers;
    state[static_cast<size_t>(comm.rank())] = after;
  }, vqddp::test::kFast);
  CHECK(vqddp::test::bitwise_equal(state[1], state[0]));
  CHECK(vqddp::test::bitwise_equal(state[2], state[0]));
  CHECK(vqddp::test::bitwise_equal(buffers_of[2], buffers_of[0]));
}

TEST_CASE("broadcast_parts: every trained part, not only the first, ends as rank 0's (the trainer's start "
          "for the codec and a GAN's discriminators)") {
  Config cfg = small_config("unused", "residual_vq");
  std::vector<NamedTensors> second(3);
  run_ranks(3, [&](Communicator& comm) {
    const uint64_t seed = 10 + static_cast<uint64_t>(comm.rank());
    CodecModel first_model(cfg.model, cfg.quantizer, 16, seed), second_model(cfg.model, cfg.quantizer, 16, seed + 7);
    std::unique_ptr<Optimizer> a = make_optimizer(cfg.optimizer, first_model.parameters()),
                               b = make_optimizer(cfg.optimizer, second_model.parameters());
    const std::vector<TrainedPart> parts{{"codec", "", first_model, *a}, {"other", "other.", second_model, *b}};
    const NamedTensors before = second_model.state_copy();
    broadcast_parts(parts, comm);
    if (comm.rank() != 0) CHECK_FALSE(vqddp::test::bitwise_equal(second_model.state_copy(), before));
    second[static_cast<size_t>(comm.rank())] = second_model.state_copy();
  }, vqddp::test::kFast);
  CHECK(vqddp::test::bitwise_equal(second[1], second[0]));
  CHECK(vqddp::test::bitwise_equal(second[2], second[0]));
}

TEST_CASE("gradient accumulation: inside NoSync gradients stay local, the next reduction sums everything") {
  run_ranks(3, [](Communicator& comm) {
    Generator g(1, 0);
    Linear lin(2, 1, g, false);
    DistributedDataParallel ddp(lin, comm);
    Tensor x = full({1, 2}, comm.rank() + 1.0);  // d/dw sum(x w^T) = x
    {
      DistributedDataParallel::NoSync no_sync(ddp);
      sum(lin(x)).backward();
      ddp.all_reduce_gradients();  // no-op
      CHECK(lin.weight.grad().to_vector<float>() == std::vector<float>(2, comm.rank() + 1.f));
      CHECK(comm.counters().collectives == 1);  // only the start-up broadcast of the weight
    }
    sum(lin(x)).backward();  // accumulates locally: 2 (r + 1)
    ddp.all_reduce_gradients();
    CHECK(lin.weight.grad().to_vector<float>() == std::vector<float>(2, 2.f * (1 + 2 + 3)));
  }, vqddp::test::kFast);
}

TEST_CASE("bit-exact resume: 2S steps straight equal S steps, stop, resume, S steps") {
  TempDir a, b;
  TrainResult r = vqddp::test::check_bit_exact_resume(small_config("unused"), synthetic_data(), a.path().string(),
                                                      b.path().string(), 8);
  CHECK(r.lead);  // the thread ranks run in this process, rank 0 included
  // inspect reads it back: one line per codebook layer.
  std::string report = inspect_checkpoint(b.file("checkpoint.safetensors"));
  CHECK(report.find("step 8") != std::string::npos);
  CHECK(report.find("quantizer.layer2") != std::string::npos);
  CHECK(report.find("K=16") != std::string::npos);
  // and lists every tensor with its checksum, for diffing two runs.
  SafetensorsFile f = read_checkpoint(b.file("checkpoint.safetensors"));
  const auto& [name, t] = f.tensors.front();
  CHECK(report.find(fmt::format("tensor {} {} {} crc32c {:08x}\n", name, dtype_name(t.dtype()), shape_str(t.shape()),
                                crc32c(t.raw_data(), t.nbytes()))) != std::string::npos);
}

TEST_CASE("bit-exact resume with a cosine learning rate: the resumed steps use the rates of their step numbers") {
  // A rate computed from the steps since the resume (or from a schedule
  // length that differs on resume) would end in other bits.
  Config cfg = small_config("unused");
  cfg.optimizer.lr_schedule = "cosine";
  cfg.optimizer.final_lr_fraction = 0.05;
  TempDir a, b;
  vqddp::test::check_bit_exact_resume(cfg, synthetic_data(), a.path().string(), b.path().string(), 8);
}

TEST_CASE("resuming a cosine schedule with another length is refused; a constant one may run longer") {
  // The length is not in the config file (--steps sets it), so the
  // checkpoint keeps it.
  Dataset data = synthetic_data();
  for (const char* schedule : {"cosine", "constant"}) {
    CAPTURE(schedule);
    TempDir dir;
    nlohmann::json j = small_config(dir.path().string()).source;
    j["optimizer"]["lr_schedule"] = schedule;
    Config cfg = parse_config(j, "run");
    cfg.schedule.steps = 4;
    TrainOptions first = quiet();
    first.stop_at_step = 2;
    train(cfg, data, first);
    Config longer = cfg;
    longer.schedule.steps = 6;
    TrainOptions resume = quiet();
    resume.resume = dir.file("checkpoint.safetensors");
    if (std::string(schedule) == "cosine") {
      CHECK_THROWS_WITH_AS(train(longer, data, resume),
                           doctest::Contains((resume.resume + ": the checkpoint's run is 4 steps long, this one 6: under "
                                              "lr_schedule \"cosine\"").c_str()),
                           Error);
      CHECK(train(cfg, data, resume).steps == 4);  // its own length resumes
    } else {
      CHECK(train(longer, data, resume).steps == 6);
    }
  }
}

TEST_CASE("a checkpoint that does not match the model names the first mismatching tensor") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = small_config(dir.path().string());
  cfg.schedule.steps = 2;
  train(cfg, data, quiet());
  Config other = small_config(dir.path().string());
  other.model.hidden = 48;
  TrainOptions resume;
  resume.resume = dir.file("checkpoint.safetensors");
  resume.print = false;
  CHECK_THROWS_WITH_AS(train(other, data, resume),
                       doctest::Contains("tensor 'param.encoder.0.weight' is float32[32, 16] on cpu in the checkpoint, "
                                         "float32[48, 16] on cpu in the model"),
                       Error);
}

TEST_CASE("resuming under a config that changes the run is an error naming the key") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = small_config(dir.path().string());
  cfg.schedule.steps = 2;
  train(cfg, data, quiet());
  nlohmann::json changed = cfg.source;
  changed["quantizer"]["decay"] = 0.5;
  Config other = parse_config(changed, "changed");
  other.schedule.steps = 4;  // more steps are fine; another decay is not
  TrainOptions resume = quiet();
  resume.resume = dir.file("checkpoint.safetensors");
  CHECK_THROWS_WITH_AS(train(other, data, resume), doctest::Contains("differs from the checkpoint's at 'quantizer.decay'"),
                       Error);
}

TEST_CASE("run.precision is part of the run: a tf32 run resumed in fp32 is an error naming the key; fp32 given "
          "is fp32 left out") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = small_config(dir.path().string());
  cfg.schedule.steps = 2;
  nlohmann::json tf32 = cfg.source;
  tf32["run"]["precision"] = "tf32";
  Config run = parse_config(tf32, "tf32");
  run.schedule.steps = 2;
  train(run, data, quiet());
  Config fp32 = cfg;
  fp32.schedule.steps = 4;
  TrainOptions resume = quiet();
  resume.resume = dir.file("checkpoint.safetensors");
  CHECK_THROWS_WITH_AS(train(fp32, data, resume), doctest::Contains("differs from the checkpoint's at 'run.precision'"),
                       Error);
  // A run without the key (fp32 by default) resumes under an explicit fp32.
  TempDir plain;
  Config implicit = small_config(plain.path().string());
  implicit.schedule.steps = 2;
  train(implicit, data, quiet());
  nlohmann::json explicit_fp32 = implicit.source;
  explicit_fp32["run"]["precision"] = "fp32";
  Config resumed = parse_config(explicit_fp32, "fp32");
  resumed.schedule.steps = 4;
  TrainOptions again = quiet();
  again.resume = plain.file("checkpoint.safetensors");
  CHECK(train(resumed, data, again).steps == 4);
}

TEST_CASE("atomic checkpoint: a write that fails midway leaves the previous checkpoint intact") {
  TempDir dir;
  std::string path = dir.file("checkpoint.safetensors");
  Generator g(0, 0);
  Linear model(64, 64, g);
  AdamW optim(model.parameters(), {});
  save_checkpoint(path, codec_part(model, optim), 1, 1, {{"k", 1}});
  std::string before = read_file(path);
  // Limit file size so write() fails with EFBIG halfway through the new file.
  signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  model.weight.fill_(5);
  bool failed = false;
  try {
    save_checkpoint(path, codec_part(model, optim), 2, 2, {{"k", 2}});
  } catch (const Error& e) {
    failed = std::string(e.what()).find("write failed") != std::string::npos;
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  CHECK(failed);
  CHECK(read_file(path) == before);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);  // no temporary file left behind
}

TEST_CASE("check-ddp passes a whole run of every shipped example bit for bit, on the CPU and on sim, and fails on a "
          "deliberately broken variant") {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  std::string root = src ? src : ".";
  // Every examples/*.json, so a new example is checked the day it ships;
  // sanitized builds: five (every model type; VQ, FSQ), on sim only the
  // conv codec and fashion_vq (every device path of both model families;
  // the suite's time stays under its limit).
  std::vector<std::string> names{"speech_codec", "speech_codec_mlp", "fashion_conv_vqvae", "fashion_vq", "fashion_fsq"};
  if (!test::sanitized_build()) {
    names.clear();
    for (const auto& e : std::filesystem::directory_iterator(root + "/examples"))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
    // speech_codec_flac is speech_codec on FLAC copies of its clips (made
    // by tests/flac_example.sh): the same model and quantizer, so the same
    // DDP path; its reader has its own tests.
    std::erase(names, "speech_codec_flac");
    std::sort(names.begin(), names.end());
    CHECK(names.size() >= 10);
  }
  for (const std::string& name : names) {
    CAPTURE(name);
    Config cfg = load_config(root + "/examples/" + name + ".json");
    cfg.data.max_examples = 2000;  // keeps the test quick; semantics do not depend on it
    cfg.data.max_files = 40;
    // Whatever backend the config trains with, check-ddp compares thread
    // ranks ("single" alone would refuse a world of 4).
    cfg.distributed.backend = name == "fashion_vq" ? "single" : cfg.distributed.backend;
    Dataset data = load_dataset(cfg.data);
    for (std::string device : {"cpu", "sim"}) {  // sim: every device path of the step, with the CPU's bits
      if (device == "sim" && test::sanitized_build() && name != "speech_codec" && name != "fashion_vq") continue;
      CAPTURE(device);
      cfg.run.device = device;
      // Two steps under the sanitizers (k-means init and the first EMA update
      // after it), three in the release build.
      CheckDdpResult r = check_ddp(cfg, data, {.world = 4, .steps = test::sanitized_build() ? 2 : 3, .print = false});
      CHECK_MESSAGE(r.passed, r.first_failure);
      CHECK(r.tensors > 30);  // parameters, optimizer moments and codebooks were compared
    }
  }
  // EMA statistics not reduced across ranks: each rank's codebook drifts.
  Config broken = load_config(root + "/examples/fashion_vq.json");
  test::set_quantizer_keys(broken, {{"sync_codebook", false}});
  broken.data.max_examples = 2000;
  Dataset data = load_dataset(broken.data);
  // Zero or negative steps would compare nothing and print PASSED.
  CHECK_THROWS_WITH_AS(check_ddp(broken, data, {.world = 4, .steps = -1, .print = false}),
                       doctest::Contains("check-ddp: steps must be in [1, 100000], got -1"), Error);
  // With revival on too, the drift shows in the codebook tensors of step 1:
  // revival runs the same collectives on every step whatever the cluster
  // sizes (which codes expired is known on the device only), so diverged
  // sizes can no longer make ranks call different collectives.
  for (int threshold : {2, 0}) {
    test::set_quantizer_keys(broken, {{"threshold_ema_dead_code", threshold}});
    for (auto mode : {CheckDdpOptions::Mode::whole_run, CheckDdpOptions::Mode::per_step}) {
      CheckDdpResult r = check_ddp(broken, data, {.mode = mode, .world = 4, .steps = 2, .print = false});
      CHECK_FALSE(r.passed);
      CHECK_FALSE(r.state_bitwise);
      CHECK_MESSAGE(r.first_failure.find("step 1: '") == 0, r.first_failure);
      CHECK_MESSAGE(r.first_failure.find("quantizer.codebook.") != std::string::npos, r.first_failure);
    }
  }
}

TEST_CASE("check-ddp per step: exact steps leave nothing to tolerate, gradients and parameters are bitwise too") {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  Config cfg = load_config(std::string(src ? src : ".") + "/examples/fashion_vq.json");
  cfg.data.max_examples = 2000;
  Dataset data = load_dataset(cfg.data);
  // Tolerance 0: before training was exact, the gradients (sums in a
  // split-dependent order) failed this; now every tensor is compared bitwise.
  CheckDdpResult r = check_ddp(
      cfg, data, {.mode = CheckDdpOptions::Mode::per_step, .world = 3, .steps = 2, .rtol = 0, .atol = 0, .print = false});
  CHECK_MESSAGE(r.passed, r.first_failure);
  CHECK(r.ranks_identical);
  CHECK(r.state_bitwise);
  CHECK(r.worst_grad_abs == 0);
  CHECK(r.worst_abs == 0);
}

TEST_CASE("check-ddp per step, bitwise, with the quantizer options that add a collective or change a step: the "
          "diversity loss, frozen codebooks, LayerNorm after project_in, heads, the rotation trick, the cross-entropy "
          "commitment loss") {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  Config base = load_config(std::string(src ? src : ".") + "/examples/fashion_vq.json");
  base.data.max_examples = 2000;
  Dataset data = load_dataset(base.data);
  // Sanitized builds (about 15x slower a step): one setting, every option on.
  const std::vector<bool> freezes = test::sanitized_build() ? std::vector<bool>{false} : std::vector<bool>{false, true};
  for (const char* type : {"vq", "residual_vq"}) {
    for (bool freeze : freezes) {
      if (test::sanitized_build() && std::string(type) == "residual_vq") continue;
      CAPTURE(type);
      CAPTURE(freeze);
      Config cfg = base;
      nlohmann::json keys = {{"type", type},
                             {"rotation_trick", true},
                             {"codebook_diversity_loss_weight", 0.1},  // a collective inside autograd
                             {"freeze_codebook", freeze},
                             // Release builds: on vq with frozen codebooks, on residual_vq with updating ones.
                             {"commitment_use_cross_entropy_loss", (std::string(type) == "residual_vq") != freeze}};
      if (std::string(type) == "vq") {
        keys["heads"] = 2;
        keys["codebook_dim"] = 3;  // a projection to 2 x 3, then the LayerNorm
        keys["layernorm_after_project_in"] = true;
      } else {
        keys["num_quantizers"] = 2;
      }
      test::set_quantizer_keys(cfg, keys);
      CheckDdpResult r = check_ddp(cfg, data,
                                   {.mode = CheckDdpOptions::Mode::per_step, .world = 3, .steps = 2, .rtol = 0,
                                    .atol = 0, .print = false});
      CHECK_MESSAGE(r.passed, r.first_failure);
      CHECK(r.state_bitwise);
      CHECK(r.worst_grad_abs == 0);
    }
  }
}

TEST_CASE("check-ddp per step, bitwise, with the orthogonal regulariser of a learnable codebook (active codes of the "
          "global batch, a random subset from the shared stream), and with its in-place SGD step (the global gradient)") {
  if (test::sanitized_build()) return;  // the option adds no kernel the sanitizers have not seen; the time goes elsewhere
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  Config cfg = load_config(std::string(src ? src : ".") + "/examples/fashion_vq.json");
  cfg.data.max_examples = 2000;
  Dataset data = load_dataset(cfg.data);
  for (const char* type : {"vq", "residual_vq", "residual_vq shared"}) {
    CAPTURE(type);
    const bool shared = std::string(type) == "residual_vq shared";
    Config run = cfg;
    nlohmann::json keys = {{"type", shared ? "residual_vq" : type},
                           {"learnable_codebook", true},
                           {"orthogonal_reg_weight", 10.0},
                           {"orthogonal_reg_active_codes_only", true},
                           {"orthogonal_reg_max_codes", 8},
                           {"in_place_codebook_optimizer", {{"type", "sgd"}, {"lr", 0.5}}}};
    if (std::string(type) != "vq") {
      keys["shared_codebook"] = shared;
      keys["num_quantizers"] = 2;
    }
    test::set_quantizer_keys(run, keys);
    CheckDdpResult r = check_ddp(
        run, data, {.mode = CheckDdpOptions::Mode::per_step, .world = 3, .steps = 2, .rtol = 0, .atol = 0, .print = false});
    CHECK_MESSAGE(r.passed, r.first_failure);
    CHECK(r.state_bitwise);
    CHECK(r.worst_grad_abs == 0);
  }
}

TEST_CASE("check-ddp per step, bitwise, with directional_reparam (DiVeQ) on vq and diveq on residual_vq: the noise of a "
          "global row, the learnable codebooks' usage statistics and their revival are the same on 3 ranks as on 1") {
  if (test::sanitized_build()) return;  // no kernel the sanitizers have not seen
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  Config cfg = load_config(std::string(src ? src : ".") + "/examples/fashion_vq.json");
  cfg.data.max_examples = 2000;
  Dataset data = load_dataset(cfg.data);
  for (const char* type : {"vq", "residual_vq"}) {
    CAPTURE(type);
    Config run = cfg;
    nlohmann::json keys = {
        {"type", type}, {"learnable_codebook", true}, {"threshold_ema_dead_code", 2.0}, {"rotation_trick", false}};
    if (std::string(type) == "vq") {
      keys["directional_reparam"] = true;
    } else {
      keys["num_quantizers"] = 2;
      keys["diveq"] = true;
    }
    test::set_quantizer_keys(run, keys);
    CheckDdpResult r = check_ddp(
        run, data, {.mode = CheckDdpOptions::Mode::per_step, .world = 3, .steps = 3, .rtol = 0, .atol = 0, .print = false});
    CHECK_MESSAGE(r.passed, r.first_failure);
    CHECK(r.state_bitwise);
    CHECK(r.worst_grad_abs == 0);
  }
}

TEST_CASE("config errors name the key path and the expected type") {
  auto fails = [](const nlohmann::json& j, const std::string& what) {
    CHECK_THROWS_WITH_AS(parse_config(j, "run.json"), doctest::Contains(what.c_str()), Error);
  };
  nlohmann::json base = {{"data", {{"sources", {{{"path", "x"}}}}}}};
  nlohmann::json j = base;
  j["quantizer"] = {{"decy", 0.9}};
  fails(j, "run.json: unknown key 'quantizer.decy' for type \"residual_vq\" (known here:");
  j = base;
  j["optimizer"] = {{"lr", "fast"}};
  fails(j, "run.json: 'optimizer.lr' must be a number, got string \"fast\"");
  j = base;
  j["schedule"] = {{"batch_size", 2.5}};
  fails(j, "'schedule.batch_size' must be an integer, got number 2.5");
  j = base;
  j["quantizer"] = {{"type", "pq"}};
  fails(j, "'quantizer.type' must be one of \"vq\", \"residual_vq\", \"fsq\", \"residual_fsq\", \"lfq\", \"residual_lfq\", \"sim_vq\", \"residual_sim_vq\", \"grouped_residual_vq\", "
           "\"grouped_residual_fsq\", \"grouped_residual_lfq\", \"fsp\", \"latent_quantize\", \"random_projection\", got \"pq\"");
  j["quantizer"] = {{"type", "random_projection"}, {"codebook_dim", 4}};
  fails(j, "'quantizer.type' \"random_projection\" makes prediction targets (no gradient reaches the encoder)");
  j = base;
  j["quantizer"] = {{"type", "fsq"}};
  fails(j, "'quantizer.levels' is required for type \"fsq\"");
  j = base;
  j["data"]["sources"][0]["weight"] = -1;
  fails(j, "'data.sources[0].weight' must be positive");
  j = base;
  j["quantizer"] = {{"decay", 1.5}};
  fails(j, "'quantizer.decay' must be in [0, 1]");
  j = base;
  j["quantizer"] = {{"num_quantizers", 2}, {"quantize_dropout_cutoff_index", 2}};
  fails(j, "'quantizer.quantize_dropout_cutoff_index' must be in [0, 1], got 2");
  j = base;
  j["modle"] = nlohmann::json::object();
  fails(j, "unknown key 'modle'");
  fails(nlohmann::json::object(), "'data.sources' needs at least one");
  CHECK_THROWS_WITH_AS(load_config("/no/such/run.json"), doctest::Contains("/no/such/run.json: cannot open config file"),
                       Error);
  TempDir dir;
  std::ofstream(dir.file("bad.json")) << "{\"model\": ";
  CHECK_THROWS_WITH_AS(load_config(dir.file("bad.json")), doctest::Contains("bad.json: not valid JSON"), Error);
}

TEST_CASE("the built-in default run is examples/speech_codec.json and every shipped example parses") {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  std::string root = src ? src : ".";
  std::ifstream in(root + "/examples/speech_codec.json");
  CHECK(nlohmann::json::parse(in) == nlohmann::json::parse(default_config_json()));
  for (const char* name : {"speech_codec", "speech_codec_mlp", "speech_codec_fsq", "speech_codec_lfq", "fashion_vq",
                           "fashion_fsq", "fashion_lfq", "fashion_conv_vqvae"})
    load_config(root + "/examples/" + name + ".json");
}

TEST_CASE("run.device is cpu by default, cuda or sim when asked, and any other value an error naming the key") {
  nlohmann::json j = {{"data", {{"sources", {{{"path", "x"}}}}}}};
  CHECK(parse_config(j, "run.json").run.device == "cpu");
  j["run"] = {{"device", "cuda"}};
  CHECK(parse_config(j, "run.json").run.device == "cuda");
  j["run"] = {{"device", "sim"}};
  CHECK(parse_config(j, "run.json").run.device == "sim");
  j["run"] = {{"device", "gpu"}};
  CHECK_THROWS_WITH_AS(parse_config(j, "run.json"),
                       doctest::Contains("run.json: 'run.device' must be one of \"cpu\", \"cuda\", \"sim\", got \"gpu\""),
                       Error);
}

TEST_CASE("distributed.check_collectives is off by default, on when asked, and must be a boolean") {
  nlohmann::json j = {{"data", {{"sources", {{{"path", "x"}}}}}}};
  CHECK_FALSE(parse_config(j, "run.json").distributed.check_collectives);
  j["distributed"] = {{"backend", "nccl"}, {"check_collectives", true}};
  CHECK(parse_config(j, "run.json").distributed.check_collectives);
  j["distributed"] = {{"check_collectives", "yes"}};
  CHECK_THROWS_WITH_AS(parse_config(j, "run.json"), doctest::Contains("'distributed.check_collectives' must be true or false, got string"),
                       Error);
}

TEST_CASE("training on cuda without a CUDA device fails before the first step and writes nothing") {
  if (cuda_device_count() > 0) return;  // the GPU suite trains there (tests/cuda/test_train.cpp)
  TempDir dir;
  Config cfg = small_config((dir.path() / "run").string());
  cfg.run.device = "cuda";
  TrainOptions opt;  // progress and checkpoints on: they would create the run directory
  // Why: no GPU, or (a CPU-only build, a missing CUDA runtime) CUDA cannot
  // be used, with its reason.
  const std::string why = cuda_unavailable_reason();
  const std::string expected = why.empty() ? "run.device is cuda but this machine has no CUDA device"
                                           : "run.device is cuda but CUDA cannot be used: " + why;
  CHECK_THROWS_WITH_AS(train(cfg, synthetic_data(), opt), doctest::Contains(expected.c_str()), Error);
  CHECK(cuda_built() == (why.find("built without CUDA") == std::string::npos));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "run"));
}

TEST_CASE("--profile: the world's FLOPs per step, summed over its ranks, against a given GEMM floor") {
  // A world of 3 computes the 1-rank step's products split three ways plus
  // what every rank repeats (its optimizer step, the codebooks' update): more
  // FLOPs than one rank, fewer than three. Rank 0's own count alone (about a
  // third) or a rank counted twice would fall outside.
  TempDir tmp;
  Dataset data = synthetic_data();
  std::map<int, TrainResult::Profile> by_world;
  for (int w : {1, 3}) {
    Config cfg = small_config((tmp.path() / fmt::format("w{}", w)).string());
    cfg.distributed.world_size = w;
    cfg.schedule.steps = 3;
    TrainOptions o = quiet();
    o.validate = false;
    o.checkpoints = false;
    o.profile = true;
    o.gemm_floor = 50;
    by_world[w] = train(cfg, data, o).profile;
  }
  CHECK(by_world[1].gemm_floor == 50);
  CHECK(by_world[1].seconds_per_step > 0);
  CHECK(by_world[1].gflop_per_step > 0);
  CHECK(by_world[3].gflop_per_step > by_world[1].gflop_per_step);
  CHECK(by_world[3].gflop_per_step < 3 * by_world[1].gflop_per_step);
  CHECK(by_world[1].floor_share() ==
        doctest::Approx(by_world[1].gflop_per_step / by_world[1].seconds_per_step / 50).epsilon(1e-12));
  // Without --profile nothing is measured.
  Config cfg = small_config((tmp.path() / "plain").string());
  cfg.schedule.steps = 1;
  TrainOptions o = quiet();
  o.validate = false;
  o.checkpoints = false;
  CHECK(train(cfg, data, o).profile.gemm_floor == 0);
}
