// What a quantizer type brings to the registry (vq/quantizer_registry.cpp):
// its name, its options struct with the config defaults, the reader of its
// keys, its factory, and how vector-quantize-pytorch names it and its state
// (for `vqddp replay`). A type defines its kind in its own .cpp with
// make_kind<Class, Options>(...) and adds one line to the registry's list; nothing
// else in the library dispatches on a type name.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/count_limits.h"
#include "vq/codebook_loss_options.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer_options.h"

namespace vqddp {

// The ranges of the quantizers' count keys (engine/core/count_limits.h).
namespace limits {
inline constexpr CountRange input_width{1, 65536};         // replay's dim
inline constexpr CountRange codebook_dim{0, 65536};         // 0: the input width
inline constexpr CountRange layers{1, 256};                 // num_quantizers
inline constexpr CountRange beam{1, 64};                    // beam_size, eval_beam_size
inline constexpr CountRange heads{1, 256};                  // quantizer.heads
inline constexpr CountRange codebook_size{2, int64_t{1} << 24};
inline constexpr CountRange fsq_level{2, 65536};
inline constexpr CountRange kmeans_iters{1, 10000};
}  // namespace limits

// What make_quantizer knows besides the options.
struct QuantizerBuild {
  int64_t dim;                           // the input width
  uint64_t seed;                         // keys the shared random streams
  std::optional<uint64_t> dropout_seed;  // quantize dropout's key, when a wrapper shares one (vq/grouped.h)
  Generator& gen;                        // initial weights
};

// One tensor of our state as the reference names and lays it out.
struct ReferenceSlot {
  enum class Layout {
    same,         // the same shape
    leading_one,  // a leading axis of 1 (the reference's num_codebooks axis)
    head,         // row `head` of a stack over `heads` (separate_codebook_per_head)
    head_row,     // the same with an axis of 1 after it (the affine statistics' [heads, 1, D])
    flag,         // our int64 [1] as a scalar (the reference's bool `initted`, written as int64)
    ours_only,    // no counterpart there (revival draws, the dropout step): kept as "vqddp.<ours>"
  };
  std::string ours, theirs;
  Layout layout = Layout::same;
  int64_t head = 0, heads = 1;
  bool optional = false;  // may be absent there (then ours keeps its initial value)
};

struct QuantizerKind {
  std::string type;  // the config's "type"
  // Its layers are residual: a decode may leave the last ones out (encode --layers).
  bool residual = false;
  // It can stand between a model's encoder and decoder: its output carries
  // a gradient to the encoder (false: targets only, e.g. BEST-RQ's).
  bool trains_encoder = true;
  std::function<QuantizerOptions()> defaults;
  // Reads the type's keys into q (of this type), checked; `dim` as in
  // read_quantizer_options. The caller finishes the section.
  std::function<void(ConfigSection&, QuantizerOptions&, int64_t dim)> read;
  std::function<std::shared_ptr<Quantizer>(const QuantizerOptions&, const QuantizerBuild&)> make;
  // Keys that exercise the type's state in tests (k-means init, revival,
  // dropout where it has them), small sizes: a JSON object.
  nlohmann::json test_keys = nlohmann::json::object();

  // vector-quantize-pytorch, for `replay`: the class name ("" where it has none);
  std::string reference_class;
  // its constructor's defaults where ours differ (applied before the keys are read);
  std::function<void(QuantizerOptions&, int64_t dim)> reference_defaults;
  // the input width when the metadata leaves "dim" out (unset: dim is required);
  std::function<int64_t(const QuantizerOptions&)> reference_dim;
  // the slots of our state tensor `ours` (unset: the same name and shape);
  std::function<std::vector<ReferenceSlot>(const QuantizerOptions&, const std::string& ours)> reference_slots;
  // its constant buffers that hold no state of ours (LFQ's `mask`).
  std::function<bool(const std::string& name)> reference_constant;
};

// `o` with the build's input width, seed and quantize-dropout key, wherever
// the type's options struct keeps them.
template <class Options>
Options with_build(Options o, const QuantizerBuild& b) {
  if constexpr (requires { o.layer.dim; })
    o.layer.dim = b.dim;  // ResidualSimVQ: its layers' width
  else
    o.dim = b.dim;
  if constexpr (requires { o.seed; }) o.seed = b.seed;
  if constexpr (requires { o.quantize_dropout.seed; }) o.quantize_dropout.seed = b.dropout_seed;
  return o;
}

// The kind of a quantizer class `Q` whose options are `Options`:
// `read(section, options, dim)` sees the type's own struct, and the factory
// makes Q(with_build(options, build), build.gen).
template <class Q, class Options>
QuantizerKind make_kind(std::string type, Options defaults, void (*read)(ConfigSection&, Options&, int64_t)) {
  QuantizerKind k;
  k.type = type;
  k.defaults = [type, defaults] { return QuantizerOptions(type, defaults); };
  k.read = [read](ConfigSection& s, QuantizerOptions& q, int64_t dim) { read(s, q.as<Options>(), dim); };
  k.make = [](const QuantizerOptions& q, const QuantizerBuild& b) -> std::shared_ptr<Quantizer> {
    return std::make_shared<Q>(with_build(q.as<Options>(), b), b.gen);
  };
  return k;
}

// The kind of `type`; an unknown type is refused listing the known ones.
const QuantizerKind& quantizer_kind(const std::string& type);
// Every kind, in the registry's order.
const std::vector<const QuantizerKind*>& quantizer_kinds();

// ---- helpers the codebook quantizers' kinds share ------------------------------

// The training terms of CodebookLossOptions and the codebook keys
// (read_codebook_options), with their checks: vq's and residual_vq's keys.
// Returns straight_through (the reference's Gumbel straight-through: its
// softmax gradient is cut by the reference's own outer straight-through
// estimator whenever the input needs a gradient, so it changes neither
// outputs nor gradients there; read with its rule, not with rotation_trick,
// and the same here).
bool read_codebook_loss_keys(ConfigSection& s, CodebookLossOptions& l, CodebookOptions& c);
// in_place_codebook_optimizer {"type": "sgd", "lr": x} into `lr` (0: off).
void read_in_place_optimizer(ConfigSection& s, float& lr, const CodebookOptions& c);
// quantize_dropout, its cutoff index and multiple into `d`, for `layers` layers.
void read_quantize_dropout(ConfigSection& s, QuantizeDropoutOptions& d, int layers);
// The section's "type" as the user wrote it (a grouped type's, not its
// layers'), `type` when it has none: the type errors name.
std::string section_type(ConfigSection& s, const std::string& type);
// levels (each in limits::fsq_level, required), with a product (the
// implicit codebook) no larger than a codebook may be.
void read_levels(ConfigSection& s, std::vector<int>& levels, const std::string& type);

// vector-quantize-pytorch's VectorQuantize defaults where ours differ
// (ResidualVQ passes them on to its layers), for `replay`.
void reference_codebook_defaults(CodebookLossOptions& l, CodebookOptions& c, int64_t dim);
// The slots an inner quantizer's kind gives for its tensor `rest`, as the
// slots of the wrapper's tensor `prefix` + rest: the same prefix on both
// sides (the reference nests it alike), and ours-only slots kept as
// "vqddp." + the wrapper's name. `kind` without slots: the same name.
std::vector<ReferenceSlot> nested_slots(const QuantizerKind& kind, const QuantizerOptions& inner,
                                        const std::string& prefix, const std::string& rest);
// The codebook a state tensor's name belongs to: its owner ("codebook",
// "codebook1", "layer2"), without ".affine" for the affine statistics.
std::string codebook_of(const std::string& ours);
// The slots of one codebook tensor `ours` (leaf embed, embed_avg,
// cluster_size, initted, or an affine statistic), under each place the
// reference holds that codebook (`prefixes`; heads > 1: separate codebooks
// stacked there, `head` this one); nullopt when `ours` is not a codebook
// tensor.
std::optional<std::vector<ReferenceSlot>> codebook_slots(const std::string& ours,
                                                         const std::vector<std::string>& prefixes, int64_t head = 0,
                                                         int64_t heads = 1);

}  // namespace vqddp
