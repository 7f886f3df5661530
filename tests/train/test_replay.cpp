// `vqddp replay`: the golden EMA steps through the replay file format, on 1
// and 3 ranks, and each malformed input named in its error.
#include <doctest/doctest.h>

#include <cmath>

#include <filesystem>

#include "engine/core/file_io.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tests/vq/harness.h"
#include "tool/replay.h"
#include "vq/assign.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

SafetensorsFile golden() {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  return safetensors_load(std::string(src ? src : ".") + "/tests/vq/golden/ema_euclidean.safetensors");
}

// A replay input made from the golden file's initial state and batches.
void write_input(const std::string& path, const SafetensorsFile& g, std::map<std::string, std::string> extra = {},
                 bool drop_embed_avg = false) {
  NamedTensors t{{"embed", g.at("embed0")}, {"cluster_size", ones({16})}};
  if (!drop_embed_avg) t.emplace_back("embed_avg", g.at("embed0"));
  for (int i = 0; i < 6; ++i) t.emplace_back("x." + std::to_string(i), g.at("x." + std::to_string(i)));
  std::map<std::string, std::string> meta{{"decay", "0.9"},          {"eps", "1e-05"},
                                          {"commitment_weight", "0.25"}, {"kmeans_init", "false"},
                                          {"threshold_ema_dead_code", "0"}, {"use_cosine_sim", "false"}};
  for (auto& [k, v] : extra) meta[k] = v;
  safetensors_save(path, t, meta);
}

}  // namespace

TEST_CASE("replay reproduces the golden EMA steps on 1 rank, 3 even ranks and an explicit shard list, and the W-rank "
          "codebooks are == the 1-rank one (bitwise)") {
  SafetensorsFile g = golden();
  TempDir dir;
  write_input(dir.file("in.safetensors"), g);
  struct Run {
    int world;
    std::string shards;
  };
  NamedTensors one_rank;  // the codebook the 1-rank run ends with (it runs first)
  for (const Run& run : {Run{1, ""}, Run{3, ""}, Run{3, "0,10,30;33,0,0;0,0,0;5,5,40;17,0,0;1,62,1"}}) {
    CAPTURE(run.world);
    CAPTURE(run.shards);
    std::string out = dir.file("out.safetensors");
    CHECK(run_replay({dir.file("in.safetensors"), out, run.world, run.shards}) == 6);
    SafetensorsFile r = safetensors_load(out);
    // Against the numpy golden (another implementation): a tolerance;
    // against this program on 1 rank (invariant 2): bit for bit.
    NamedTensors book{{"embed", r.at("embed")}, {"embed_avg", r.at("embed_avg")}, {"cluster_size", r.at("cluster_size")}};
    if (run.world == 1)
      one_rank = book;
    else
      CHECK(vqddp::test::first_difference(book, one_rank) == "");
    vqddp::test::check_close({{"embed", r.at("embed")}, {"embed_avg", r.at("embed_avg")}, {"cs", r.at("cluster_size")}},
                             {{"embed", g.at("embed.5")}, {"embed_avg", g.at("embed_avg.5")}, {"cs", g.at("cluster_size.5")}},
                             1e-5, 1e-6);
    for (int i = 0; i < 6; ++i) {
      CAPTURE(i);
      std::string s = std::to_string(i);
      CHECK(r.at("indices." + s).to_vector<int64_t>() == g.at("indices." + s).to_vector<int64_t>());
      CHECK(r.at("loss." + s).item<float>() == doctest::Approx(g.at("loss." + s).item<float>()).epsilon(1e-5));
    }
    CHECK(r.metadata.at("world") == std::to_string(run.world));
  }
}

TEST_CASE("replay errors name the file and the key or tensor, and write nothing") {
  SafetensorsFile g = golden();
  TempDir dir;
  std::string in = dir.file("in.safetensors"), out = dir.file("out.safetensors");
  auto fails_with = [&](const std::string& what, const std::string& shards = "", int world = 1) {
    CHECK_THROWS_WITH_AS(run_replay({in, out, world, shards}), doctest::Contains(what.c_str()), Error);
    CHECK_FALSE(std::filesystem::exists(out));
  };
  write_input(in, g, {{"decay_rate", "0.9"}});
  fails_with("in.safetensors metadata: unknown key 'decay_rate'");
  write_input(in, g, {{"use_cosine_sim", "maybe"}});
  fails_with("in.safetensors metadata: 'use_cosine_sim' must be true or false, got string");
  // The config's name of the key, not another spelling of replay's own.
  write_input(in, g, {{"cosine", "false"}});
  fails_with("in.safetensors metadata: unknown key 'cosine'");
  // The config's checks: the same range as a config's quantizer.decay.
  write_input(in, g, {{"decay", "1.5"}});
  fails_with("in.safetensors metadata: 'decay' must be in [0, 1]");
  write_input(in, g, {{"learnable_codebook", "true"}});
  fails_with("in.safetensors metadata: 'learnable_codebook' must be false");
  write_input(in, g, {}, true);
  fails_with("missing tensor 'embed_avg'");
  write_input(in, g);
  fails_with("--shards gives 3 rows for batch x.0, which has 40", "1,1,1", 3);
  fails_with("has 2 entries for --world 3", "1,1", 3);
  safetensors_save(in, {{"embed", ones({4, 2})}, {"embed_avg", ones({4, 2})}, {"cluster_size", ones({4})}});
  fails_with("missing tensor 'x.0'");
  safetensors_save(in, {{"embed", ones({4, 2})}, {"embed_avg", ones({4, 2})}, {"cluster_size", ones({4})},
                        {"x.0", ones({3, 2})}, {"x.2", ones({3, 2})}});
  fails_with("unexpected tensor 'x.2'");
  safetensors_save(in, {{"embed", ones({4, 2})}, {"embed_avg", ones({4, 2})}, {"cluster_size", ones({4})},
                        {"x.0", ones({3, 5})}});
  fails_with("'x.0' must be float32 [N, 2]");
  write_input(in, g, {{"seed", "-1"}});
  fails_with("in.safetensors metadata: 'seed' must be an integer in [0, 2^64 - 1], got number");
  write_input(in, g, {{"kmeans_iters", "2.5"}});
  fails_with("in.safetensors metadata: 'kmeans_iters' must be an integer, got number");
  // A non-finite row names the file, the batch, its rows and the rank.
  Tensor x1 = g.at("x.1").clone();
  x1.data<float>()[3 * x1.size(1)] = std::nanf("");
  safetensors_save(in, {{"embed", g.at("embed0")}, {"embed_avg", g.at("embed0")}, {"cluster_size", ones({16})},
                        {"x.0", g.at("x.0")}, {"x.1", x1}});
  fails_with(fmt::format("{}: batch x.1 (rows 0 to {} on rank 0): ", in, x1.size(0)));
  fails_with("row 3 of the codebook's input has a non-finite value (in column 0)");
  // replay IN IN would overwrite its input.
  write_input(in, g);
  std::string before = read_file(in);
  CHECK_THROWS_WITH_AS(run_replay({in, in, 1, ""}),
                       doctest::Contains(fmt::format("replay: the output {} is the input file", in).c_str()), Error);
  CHECK(read_file(in) == before);
}
