// The run record (train/run_record.h): every record reads back what it
// wrote, a NaN (written as null) and an absent key read as nothing, and a
// metrics line is told apart by its keys alone.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/core/error.h"
#include "train/run_record.h"

using namespace vqddp;

TEST_CASE("run record: each record reads back what it wrote; NaN and absent numbers read as nothing") {
  RunFacts r{.description = "d", .backend = "thread", .device = "cpu", .world_size = 3, .total_steps = 9,
             .sample_rate = 8000, .example_dim = 320, .bits_per_example = 40.0, .bitrate = 1000.0,
             .layer_sizes = {16, 8}, .config = {{"x", 1}}};
  // The keys are a contract (the report and users' scripts read them):
  // spelled out here, so a misspelt one in the writer fails, and every
  // field read back, so one the reader misses fails.
  const nlohmann::json rj = {{"description", "d"}, {"backend", "thread"}, {"device", "cpu"}, {"world_size", 3},
                             {"total_steps", 9}, {"sample_rate", 8000}, {"example_dim", 320},
                             {"bits_per_example", 40.0}, {"bitrate", 1000.0}, {"layer_sizes", {16, 8}},
                             {"config", {{"x", 1}}}};
  CHECK(to_json(r) == rj);
  const RunFacts back = run_facts_from_json(nlohmann::json::parse(to_json(r).dump()), "run.json");
  CHECK(to_json(back) == rj);
  CHECK(back.backend == "thread");
  CHECK(back.device == "cpu");
  CHECK(back.sample_rate == 8000);
  CHECK(back.example_dim == 320);
  CHECK(back.bits_per_example == 40.0);
  CHECK(back.description == "d");
  CHECK(back.world_size == 3);
  CHECK(back.total_steps == 9);
  CHECK(back.bitrate == 1000.0);
  CHECK(back.layer_sizes == std::vector<int64_t>{16, 8});
  CHECK(back.config == r.config);

  TrainLine t{.step = 4, .loss = 0.5, .recon = std::nan(""), .lr = 1e-3, .steps_per_s = 2.0, .quantizer = std::nullopt,
              .discriminator = std::nullopt, .adversarial = std::nullopt, .feature = std::nullopt, .revived = 1,
              .layers = {{2.5, 3}, {std::nullopt, 1}}, .skipped_rows = 2};
  const nlohmann::json tj = nlohmann::json::parse(to_json(t).dump());
  CHECK(tj == nlohmann::json{{"step", 4}, {"loss", 0.5}, {"recon", nullptr}, {"lr", 1e-3}, {"steps_per_s", 2.0},
                             {"revived", 1}, {"skipped_rows", 2},
                             {"layers", {{{"perplexity", 2.5}, {"codes_used", 3}},
                                         {{"codes_used", 1}}}}});
  nlohmann::json no_nan = tj;  // the NaN reads back as nothing, written as no key
  no_nan.erase("recon");
  CHECK(to_json(train_line_from_json(tj).value()) == no_nan);
  CHECK_FALSE(is_validation_line(tj));
  CHECK_FALSE(validation_line_from_json(tj).has_value());
  const TrainLine tb = train_line_from_json(tj).value();
  CHECK(tb.step == 4);
  CHECK(tb.loss == 0.5);
  CHECK_FALSE(tb.recon.has_value());  // NaN: written as null
  CHECK(tb.revived == 1);
  REQUIRE(tb.layers.size() == 2);
  CHECK(tb.layers[0].perplexity == 2.5);
  CHECK(tb.layers[0].codes_used == 3);
  CHECK_FALSE(tb.layers[1].perplexity.has_value());
  CHECK(tb.skipped_rows == 2);

  ValidationLine v{.step = 6, .mse = 0.1, .snr_db = 3.0, .log_mel_l1 = std::nullopt, .stft_distance = std::nullopt,
                     .stoi = std::nullopt, .layers = {{4.0, 5}}, .skipped_rows = 0};
  const nlohmann::json vj = nlohmann::json::parse(to_json(v).dump());
  CHECK(vj == nlohmann::json{{"step", 6}, {"validation_mse", 0.1}, {"validation_snr_db", 3.0},
                             {"validation_layers", {{{"perplexity", 4.0}, {"codes_used", 5}}}}});
  CHECK(to_json(validation_line_from_json(vj).value()) == vj);
  CHECK(is_validation_line(vj));
  CHECK_FALSE(train_line_from_json(vj).has_value());
  const ValidationLine vb = validation_line_from_json(vj).value();
  CHECK(vb.step == 6);
  CHECK(vb.snr_db == 3.0);
  CHECK_FALSE(vb.log_mel_l1.has_value());
  CHECK(vb.layers.at(0).codes_used == 5);
  CHECK_FALSE(vj.contains("validation_skipped_rows"));  // written only when rows were skipped

  CodeUsage u{.step = 6, .counts = {{3, 0, 1}, {4}}};
  const CodeUsage ub = code_usage_from_json(nlohmann::json::parse(to_json(u).dump()), "code_usage.json");
  CHECK(ub.step == 6);
  CHECK(ub.counts == u.counts);
  CHECK_THROWS_WITH_AS(code_usage_from_json({{"step", 1}}, "code_usage.json"),
                       doctest::Contains("code_usage.json: malformed: no \"layers\" array"), Error);
  // A line cut off by a kill (no step) is neither kind.
  CHECK_FALSE(train_line_from_json({{"loss", 1.0}}).has_value());
}
