// examples/embed: vqddp inside a training loop of your own.
//
// A small autoencoder with a residual VQ bottleneck learns noisy sinusoid
// frames, trained data-parallel on W thread ranks of this one process by the
// loop below: no JSON config, no Trainer. It uses only the installed package
// (<vqddp/vqddp.h>, found by pkg-config), so it is also the template for
// putting vqddp into your own program. docs/embedding.md walks through it.
//
//   embed [--world W] [--steps N] [--log-every K] [--checkpoint PATH] [--resume]
//
// --steps is the TOTAL step count: `--steps 400 --resume` after a 200-step
// run trains steps 201..400 and ends where an uninterrupted 400-step run ends.
#include <vqddp/vqddp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace vqddp;

namespace {

// The run's fixed settings. The checkpoint records them (run_config), and a
// resume from a checkpoint made with other settings is refused.
constexpr uint64_t kSeed = 1234;
constexpr int64_t kBatch = 256;  // the GLOBAL batch, split over the ranks
constexpr int64_t kUnit = 8;     // examples per unit (exact steps: engine/exact_batch.h)
constexpr int64_t kUnits = kBatch / kUnit;
constexpr int64_t kFrame = 16;   // F: samples per frame, the model's input
constexpr int64_t kHidden = 64;
constexpr int64_t kLatent = 8;  // D: what the quantizer quantizes
constexpr int kQuantizers = 3;
constexpr int64_t kCodebookSize = 32;  // K, every layer
constexpr float kLr = 3e-3f;
// Data stream ids: a range of our own, below 2^32 like every shared stream
// and apart from the library's ranges (engine/core/streams.h).
constexpr uint64_t kDataStream = 0x70000000;

constexpr const char* kUsage =
    "usage: embed [--world W] [--steps N] [--log-every K] [--checkpoint PATH] [--resume]\n";

struct Flags {
  int world = 2;
  int64_t steps = 200;
  int64_t log_every = 20;
  std::string checkpoint = "embed.safetensors";
  bool resume = false;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t count_flag(std::string_view flag, std::string_view text, CountRange range) {
  std::optional<int64_t> v = parse_int(text);
  if (!v) throw UsageError(fmt::format("{} must be an integer, got '{}'", flag, text));
  if (!range.contains(*v)) throw UsageError(fmt::format("{} {}", flag, range.violation(text)));
  return *v;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--resume") {
      f.resume = true;
      continue;
    }
    if (flag != "--world" && flag != "--steps" && flag != "--log-every" && flag != "--checkpoint")
      throw UsageError(fmt::format("unknown flag '{}'", flag));
    if (i + 1 == argc) throw UsageError(fmt::format("{} needs a value", flag));
    std::string_view value = argv[++i];
    if (flag == "--world")  // at most one rank per row: every rank gets rows
      f.world = static_cast<int>(count_flag(flag, value, {1, kBatch}));
    else if (flag == "--steps")  // the data stream ids must stay below 2^32
      f.steps = count_flag(flag, value, {1, 100000000});
    else if (flag == "--log-every")
      f.log_every = count_flag(flag, value, {1, limits::kNoLimit});
    else if (value.empty())
      throw UsageError("--checkpoint needs a path");
    else
      f.checkpoint = value;
  }
  return f;
}

// The global batch of step s (1-based), (kBatch, kFrame): sinusoids of random
// amplitude, frequency and phase plus noise. A function of (kSeed, s) alone,
// so a resumed run sees the batches an uninterrupted one does, on any number
// of ranks. (Every rank draws it whole and keeps its share: cheap here; a
// real loader would read only its own rows.)
Tensor global_batch(int64_t step) {
  Generator gen(kSeed, kDataStream + static_cast<uint64_t>(step));
  std::vector<float> v(kBatch * kFrame);
  for (int64_t n = 0; n < kBatch; ++n) {
    const float amplitude = 0.5f + gen.uniform();
    const float frequency = 0.2f + 0.8f * gen.uniform();
    const float phase = 2.f * std::numbers::pi_v<float> * gen.uniform();
    for (int64_t j = 0; j < kFrame; ++j)
      v[n * kFrame + j] = amplitude * std::sin(frequency * static_cast<float>(j) + phase) + 0.05f * gen.normal();
  }
  return from_vector(v, {kBatch, kFrame});
}

std::shared_ptr<Sequential> mlp(int64_t in, int64_t out, Generator& gen) {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Linear>(in, kHidden, gen))
      .add(std::make_shared<Activation>([](const Tensor& t) { return gelu(t); }))
      .add(std::make_shared<Linear>(kHidden, out, gen));
  return net;
}

ResidualVQOptions quantizer_options() {
  ResidualVQOptions q;
  q.dim = kLatent;
  q.num_quantizers = kQuantizers;
  q.codebook_size = kCodebookSize;
  q.codebook.decay = 0.95f;                 // EMA codebooks (the default kind)
  q.codebook.kmeans_init = true;            // from the first batch, the same on every rank
  q.codebook.kmeans_iters = 10;
  q.codebook.threshold_ema_dead_code = 2.f; // revive codes whose EMA count falls below 2
  q.seed = kSeed;                           // keys the codebooks' shared random streams
  return q;
}

// x (N, F) -> encoder -> (N, D) -> ResidualVQ -> (N, D) -> decoder -> (N, F).
// Registration order names the tensors ("encoder.0.weight",
// "quantizer.layer0.embed", ...): DDP broadcasts and checkpoints store them
// in that order, so it must depend on nothing but this code.
struct Autoencoder : Module {
  std::shared_ptr<Sequential> encoder, decoder;
  std::shared_ptr<ResidualVQ> quantizer;

  Autoencoder() {
    // The same seed on every rank gives every rank the same initial weights
    // (DDP broadcasts rank 0's anyway; this keeps 1 rank and W ranks alike).
    Generator gen(kSeed, streams::kInit);
    encoder = register_module("encoder", mlp(kFrame, kLatent, gen));
    quantizer = register_module("quantizer", std::make_shared<ResidualVQ>(quantizer_options(), gen));
    decoder = register_module("decoder", mlp(kLatent, kFrame, gen));
  }
};

// The settings a bit-exact continuation depends on, stored in the
// checkpoint's metadata; load_checkpoint compares these sections. The world
// size is not one of them: the global batch is the same on any W.
nlohmann::json run_config() {
  const ResidualVQOptions q = quantizer_options();
  return {{"model", {{"frame", kFrame}, {"hidden", kHidden}, {"latent", kLatent}}},
          {"quantizer", {{"type", "residual_vq"}, {"num_quantizers", q.num_quantizers},
                         {"codebook_size", q.codebook_size}, {"decay", q.codebook.decay},
                         {"kmeans_iters", q.codebook.kmeans_iters},
                         {"threshold_ema_dead_code", q.codebook.threshold_ema_dead_code}}},
          {"data", {{"type", "sinusoids"}}},
          {"optimizer", {{"type", "adamw"}, {"lr", kLr}}},
          {"schedule", {{"batch_size", kBatch}}},
          {"run", {{"seed", kSeed}}}};
}

// One rank's whole run; run_ranks calls it on W threads at once.
void train_rank(Communicator& comm, const Flags& flags) {
  const bool lead = comm.rank() == 0;
  Autoencoder model;
  const std::vector<Tensor> params = model.parameters();  // the codebooks are buffers, not parameters
  AdamW optim(params, AdamWOptions{.lr = kLr});

  // Every rank loads (parameters, codebook buffers, optimizer moments)
  // before the broadcast, which sets every rank to rank 0's state anyway.
  int64_t done = 0;
  if (flags.resume) {
    const nlohmann::json config = run_config();
    done = load_checkpoint(flags.checkpoint, codec_part(model, optim), flags.steps, &config);
    if (lead) fmt::print("resumed from step {}\n", done);
  }
  broadcast_parameters(model, comm);  // a collective: every rank calls it

  // This rank's share: whole UNITS of kUnit consecutive examples, a
  // contiguous block. In rank order the blocks ARE the global batch, in its
  // order, so the global row numbers the codebooks' k-means init and
  // dead-code revival sample by are the ones a single rank would use. Units
  // make training exact (engine/exact_batch.h): every sum over the batch is
  // taken per unit and added in unit order, so W ranks give 1 rank's bits.
  const int world = comm.world_size();
  std::vector<int64_t> rank_units;  // units of each rank
  for (int r = 0; r < world; ++r) rank_units.push_back(kUnits * (r + 1) / world - kUnits * r / world);
  const int64_t begin = kUnit * (kUnits * comm.rank() / world);
  const int64_t end = begin + kUnit * rank_units[comm.rank()];

  model.train();
  for (int64_t step = done + 1; step <= flags.steps; ++step) {
    Tensor x = global_batch(step).slice_rows(begin, end);  // (N_r, F)
    Tensor loss;
    CodebookMetrics m;
    {
      // An exact step: its means are over the GLOBAL batch (one collective
      // each, the same value on every rank), and backward() reduces the
      // gradient over the ranks on the way (one collective).
      ExactBatchScope exact(exact_batch_for(comm, std::vector<int64_t>(rank_units[comm.rank()], kUnit), rank_units));
      Tensor z = model.encoder->forward(x);  // (N_r, D)
      // A collective: in training EVERY rank must call it, every step (the
      // codebooks all-reduce their counts and sums here and update alike).
      auto q = model.quantizer->quantize(z, comm);
      Tensor recon = model.decoder->forward(q.quantized);  // (N_r, F)
      loss = add(global_mse_or_zero(recon, x, comm), q.loss);     // the global batch's mean loss
      loss.backward();  // every rank ends with the global batch's gradients
      m = q.metrics[0];
    }
    clip_grad_norm(params, 1.f);  // every rank clips the same gradient
    optim.step();
    optim.zero_grad();

    if (step % flags.log_every == 0 || step == flags.steps) {
      // Layer 0's metrics, from the GLOBAL code counts of this step (every
      // rank holds the same numbers); the deeper layers' are q.metrics[1..].
      if (lead)
        fmt::print("step {} loss {:.4f} perplexity {:.2f} codes used {}/{}\n", step, loss.item<float>(),
                   m.perplexity(), m.codes_used(), kCodebookSize);
    }
  }

  // Parameters, buffers (codebooks, their EMA state, counters), optimizer
  // state and the step, written atomically (temporary file + rename). All
  // ranks hold the same state, so rank 0 alone writes it.
  if (lead) save_checkpoint(flags.checkpoint, codec_part(model, optim), flags.steps, flags.steps, run_config());
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const UsageError& e) {
    fmt::print(stderr, "embed: {}\n{}", e.what(), kUsage);
    return 2;
  }
  try {
    // W threads, one communicator each; an exception on any rank aborts the
    // others (no hang) and the first one is rethrown here.
    run_ranks(flags.world, [&](Communicator& comm) { train_rank(comm, flags); });
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "embed: {}\n", e.what());
    return 1;
  }
  return 0;
}
