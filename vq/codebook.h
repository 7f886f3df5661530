// One codebook: EMA-trained (the default) or learnable (trained by
// gradients), Euclidean or cosine. docs/design.md section 1 is the spec;
// the training forward runs its steps in exactly that order:
//   1. k-means init if not initted (distributed, vq/kmeans.h)
//   2. assign: nearest code, ties to the lowest index (vq/assign.h)
//   3. quantize = embed[index] from the codebook BEFORE this step's update
//   4. local stats: counts and sums in one buffer (vq/code_stats.h), the
//      sums exact on a grid every rank agrees by one MAX all_reduce of the
//      rows' largest |value| first
//   5. ONE all_reduce SUM of that buffer, every training step, every rank
//   6. EMA of cluster_size and embed_avg
//   7. Laplace-smoothed normalisation: embed = embed_avg / cs~
//   8. dead-code revival AFTER the EMA, resetting embed, embed_avg and
//      cluster_size together (the ESPnet #6284 fix), rows from the sampler
//   9. metrics from the GLOBAL counts (computed on the device when read)
// Every decision that picks a collective (init or not, revive or not, skip
// an empty world) reads state that is identical on every rank or values that
// were just all-reduced, so all ranks always make the same calls (invariant 6).
// The communicator is an argument of forward(), never stored (invariant 8).
//
// Inference runs steps 2 and 3 only: no collective, no state change; an
// uninitialised codebook is an error there. Inference is eval mode OR grad
// mode off: a validation pass under no-grad that only some ranks run must
// not issue a collective even if the model was left in training mode (the
// hang vector-quantize-pytorch users hit), so updates need both training
// mode and grad mode.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/nn.h"
#include "engine/ops.h"
#include "vq/code_stats.h"
#include "vq/codebook_affine.h"

namespace vqddp {

struct CodebookOptions {
  int64_t codebook_size = 512;  // K
  int64_t dim = 0;              // D
  bool cosine = false;
  bool learnable = false;  // gradient-trained embed (no EMA, no revival unless track_usage)
  float decay = 0.99f;
  float eps = 1e-5f;
  float threshold_ema_dead_code = 2.f;  // 0 disables revival
  bool kmeans_init = true;
  int kmeans_iters = 50;
  bool cluster_size_init_ones = true;  // false: zeros
  uint64_t seed = 0;                   // keys the codebook's shared random streams
  // false skips step 5: each rank updates from its own rows only. That is
  // the data-parallel bug the Python libraries had (codebooks silently
  // diverge); it exists so `vqddp check-ddp` can show that it catches it.
  bool sync_stats = true;
  // stochastic_sample_codes: codes drawn from softmax(logits / temperature)
  // in training steps (vq/gumbel_sample.h) instead of the nearest; a
  // temperature of 0 keeps the nearest, as the reference.
  bool stochastic_sample = false;
  // ema_update false (vector-quantize-pytorch's key): an EMA codebook's
  // codes stay as they are; with revival on, the usage statistics are still
  // tracked and dead codes still replaced, as the reference does.
  bool ema_update = true;
  // affine_param (vq/codebook_affine.h): Euclidean codes used in the batch's
  // space by EMAs of the global batch's and the codebook's moments.
  bool affine_param = false;
  float affine_param_batch_decay = 0.99f;
  float affine_param_codebook_decay = 0.9f;
  float sample_temperature = 1.f;  // sample_codebook_temp
  // A learnable codebook that still tracks usage (directional_reparam, as
  // the reference's learnable codebooks do): cluster_size and embed_avg
  // buffers move by EMA, the codes stay the optimizer's, and dead codes are
  // revived (threshold_ema_dead_code > 0). Euclidean only: a cosine
  // codebook's normalisation would read the revived rows in its backward.
  bool track_usage = false;
  bool operator==(const CodebookOptions&) const = default;
};

// The seed of a module's i-th codebook (head or layer): distinct streams per
// codebook, the same on every rank.
inline uint64_t codebook_seed(uint64_t module_seed, int i) { return module_seed * 1000003 + static_cast<uint64_t>(i); }

// A codebook step's metrics. They stay on the codebook's device as the
// step's all-reduced statistics until asked for: the first accessor call
// reads the counts, the flags and the revived count in one counted copy
// and computes the metrics on the host (the same formula, so the same
// bits, for every device), so a training step that does not log them never
// waits for the device and never computes them.
// Reading them also raises the step's NonFiniteError, if a rank flagged a
// non-finite input row (code_stats.h); on the CPU the codebook raises it in
// the step itself, where reading is free.
class CodebookMetrics {
 public:
  // A step that does not update (eval, no-grad): every number is 0, the
  // perplexity included.
  CodebookMetrics() = default;
  // Host numbers (an empty world, tests).
  static CodebookMetrics of(double perplexity, int64_t codes_used, int64_t codes_revived, int64_t rows);
  // The metrics of a step in which no rank had rows.
  static CodebookMetrics empty_world() { return of(1.0, 0, 0, 0); }
  // The device form, from a step's all-reduced stats (StatsLayout) after the
  // revival wrote its count into them: their counts and tail are copied
  // on the device. A metrics object and its copies belong to the rank
  // thread that made them (the read is queued on that thread's stream).
  static CodebookMetrics on_device(const Tensor& stats, const StatsLayout& layout);

  // exp(entropy) of the global code counts (vq/perplexity.h); 1 when the
  // world batch had no rows (all counts 0), 0 for a step that did not update.
  double perplexity() const;
  int64_t codes_used() const;     // codes chosen by at least one row of the global batch
  int64_t codes_revived() const;  // dead codes replaced this step
  int64_t rows() const;           // rows in the global batch
  // Throws NonFiniteError naming every rank that flagged a row (and the row).
  void check() const;

 private:
  struct State;
  const State& host() const;
  std::shared_ptr<State> state_;
};

struct CodebookOutput {
  Tensor quantize;  // (N, D) codebook rows (for learnable codebooks: differentiable w.r.t. embed)
  Tensor indices;   // (N) int64
  CodebookMetrics metrics;
};

// Steps 1-3 of a forward for one input (Codebook::nearest).
struct CodebookAssignment {
  Tensor prepared;  // (N, D) checked (cosine: normalised) input rows
  Tensor indices;   // (N) int64
  Tensor codes;     // (N, D) the codebook's rows for them, before this step's update
};

class Codebook : public Module {
 public:
  // `init_gen` draws the initial (kaiming-uniform) codebook when k-means
  // init is off.
  Codebook(const CodebookOptions& options, Generator& init_gen);

  // x (N, D) of this rank. In training, every rank must call, also with N = 0.
  CodebookOutput forward(const Tensor& x, Communicator& comm);

  // Codes (M, D) for indices (M) in [0, K); no collective, no state change.
  // Indices from outside are checked (one read on a device); the codebook's
  // own assignment passes Indices::trusted.
  Tensor lookup(const Tensor& indices, Indices from = Indices::checked) const;

  // The pieces forward() is made of, for modules that quantize several
  // inputs with one codebook and update it once (ResidualVQ's shared
  // codebook; Module::updates_state() says whether a step may update it):
  // Checked (and, for cosine, l2-normalised) input rows.
  Tensor prepare(const Tensor& x, const Communicator& comm) const;
  // Runs k-means init if pending (update mode only). Returns false when no
  // rank had rows, on every rank alike; throws in inference if uninitialised.
  bool ensure_initialised(const Tensor& prepared, Communicator& comm);
  // Nearest codes (N), from the current codebook.
  Tensor assign(const Tensor& prepared) const;
  // prepare, ensure_initialised, assign and lookup: the first half of
  // forward(), which ResidualVQ runs per layer too. Empty when no rank had
  // rows (on every rank alike): nothing to quantize anywhere.
  // With `given` (N) int64 indices, those codes instead of the nearest
  // (ResidualVQ's beam search chose them).
  std::optional<CodebookAssignment> nearest(const Tensor& x, Communicator& comm, const Tensor& given = Tensor());
  // Steps 4-9 for prepared rows and their indices: one all-reduce, EMA,
  // normalisation, revival; metrics of the global counts.
  CodebookMetrics update(const Tensor& prepared, const Tensor& indices, Communicator& comm);
  // The same with one EMA step per row set, in order (ResidualVQ's shared
  // codebook: one set per layer, as each layer of vector-quantize-
  // pytorch's ResidualVQ steps the shared codebook), all in one all-reduce;
  // `all_rows`/`all_indices` hold every set's rows in an order that is the
  // same on any split: the metrics count them and revival samples them.
  CodebookMetrics update_layers(const std::vector<Tensor>& prepared, const std::vector<Tensor>& indices,
                                const Tensor& all_rows, const Tensor& all_indices, Communicator& comm);

  // The codebook (K, D) as assign and lookup use it (cosine: unit rows),
  // with the embed's gradient when it is learnable.
  Tensor codes() const;

  const CodebookOptions& options() const { return opt_; }
  // cluster_size and embed_avg exist and move: an EMA codebook, or a
  // learnable one with track_usage.
  bool tracks_usage() const { return !opt_.learnable || opt_.track_usage; }
  // The next of this codebook's shared random streams (counted in its
  // `draws` buffer, so a resumed run draws on): for draws other modules
  // make on its behalf (the orthogonal regulariser's subset of codes).
  Generator draw_stream() { return next_shared_generator(); }
  bool initted() const { return initted_.item<int64_t>() != 0; }

  Tensor embed;         // (K, D) buffer, or parameter when learnable
  Tensor embed_avg;     // (K, D) EMA of the code sums (EMA only)
  Tensor cluster_size;  // (K) EMA of the code counts (EMA only)

 private:
  void check_input(const Tensor& x, const Communicator& comm) const;
  void revive_dead_codes(const Tensor& x, Tensor& stats, const StatsLayout& layout, Communicator& comm);
  Generator next_shared_generator();
  // assign(), or in a training step with stochastic_sample_codes a sample
  // (one shared stream per call, row numbers from a gather of the counts).
  Tensor choose(const Tensor& prepared, Communicator& comm);

  CodebookOptions opt_;
  Tensor initted_;  // int64 (1): 1 once the codebook holds trained or k-means values
  // int64 (1): shared random streams used so far (stream id of the next):
  // k-means init takes one, and every update step with revival on takes
  // one, whether or not a code expired (the host cannot know that without
  // waiting for the device). int64 buffers stay on the host (Module::to).
  Tensor draws_;
  std::shared_ptr<CodebookAffine> affine_;  // with affine_param
};

}  // namespace vqddp
