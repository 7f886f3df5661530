// Quantizer options as users write them (a config's "quantizer" section, a
// replay file's metadata, an embedding program's code), their reader and
// the factory that makes a Quantizer from them.
//
// Every quantizer type owns its options struct (VectorQuantizeOptions,
// FSQOptions, ...), its reader of the keys it knows, its factory and its
// mapping to vector-quantize-pytorch for `replay`, all in its own file, as
// one QuantizerKind (vq/quantizer_kind.h); vq/quantizer_registry.cpp lists
// the kinds. QuantizerOptions holds a type name and that type's struct:
//
//   QuantizerOptions q = QuantizerOptions::of("residual_vq");  // the config defaults
//   q.as<ResidualVQOptions>().num_quantizers = 8;
//   read_quantizer_options(section, q, dim);  // or: parse_quantizer_options(json, dim)
//   auto quantizer = make_quantizer(q, dim, seed, init_gen);
//
// The keys each type reads are listed in docs/config.md; a key of
// another type is an unknown key naming the type and the keys it knows,
// never a setting silently ignored, and a bad value is refused naming the
// key path and what is allowed, before anything is built or read.
#pragma once

#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/config_reader.h"
#include "engine/core/error.h"
#include "engine/core/random.h"
#include "vq/codebook.h"
#include "vq/quantizer.h"

namespace vqddp {

struct QuantizerKind;

class QuantizerOptions {
 public:
  // residual_vq's defaults (a config's default type).
  QuantizerOptions();
  // `type`'s config defaults; an unknown type is refused listing the known ones.
  static QuantizerOptions of(const std::string& type);
  // `options` as the options of `type` (whose kind must hold an Options).
  template <class Options>
  QuantizerOptions(std::string type, Options options)
      : type_(std::move(type)), held_(std::make_unique<Held<Options>>(std::move(options))) {}

  QuantizerOptions(const QuantizerOptions& o) : type_(o.type_), held_(o.held_ ? o.held_->clone() : nullptr) {}
  QuantizerOptions(QuantizerOptions&&) noexcept = default;
  QuantizerOptions& operator=(const QuantizerOptions& o) {
    if (this != &o) *this = QuantizerOptions(o);
    return *this;
  }
  QuantizerOptions& operator=(QuantizerOptions&&) noexcept = default;
  bool operator==(const QuantizerOptions& o) const {
    return type_ == o.type_ && (held_ && o.held_ ? held_->equals(*o.held_) : held_ == o.held_);
  }

  const std::string& type() const { return type_; }
  const QuantizerKind& kind() const;

  // The type's own options struct; asking for another struct is refused
  // naming the type (a programming error, not a user's).
  template <class Options>
  Options& as() {
    return const_cast<Options&>(std::as_const(*this).as<Options>());
  }
  template <class Options>
  const Options& as() const {
    auto* h = dynamic_cast<const Held<Options>*>(held_.get());
    VQDDP_CHECK(h != nullptr, "quantizer options: type \"{}\" holds no {}", type_, typeid(Options).name());
    return h->value;
  }

  // The codebook hyper-parameters, for types with EMA codebooks (vq,
  // residual_vq and their grouped forms); nullptr for the others.
  const CodebookOptions* codebook() const { return held_->codebook(); }

 private:
  struct Holder {
    virtual ~Holder() = default;
    virtual std::unique_ptr<Holder> clone() const = 0;
    virtual bool equals(const Holder& o) const = 0;
    virtual const CodebookOptions* codebook() const = 0;
  };
  template <class Options>
  struct Held final : Holder {
    explicit Held(Options v) : value(std::move(v)) {}
    std::unique_ptr<Holder> clone() const override { return std::make_unique<Held>(value); }
    bool equals(const Holder& o) const override {
      auto* h = dynamic_cast<const Held*>(&o);
      return h != nullptr && h->value == value;
    }
    const CodebookOptions* codebook() const override {
      if constexpr (requires { { value.codebook } -> std::convertible_to<const CodebookOptions&>; })
        return &value.codebook;
      else if constexpr (requires { value.inner.codebook(); })
        return value.inner.codebook();
      else
        return nullptr;
    }
    Options value;
  };

  std::string type_;
  std::unique_ptr<Holder> held_;
};

// The type names, in the registry's order.
const std::vector<std::string>& quantizer_types();

// The codebook keys (decay, eps, threshold_ema_dead_code, kmeans_init,
// kmeans_iters, use_cosine_sim, learnable_codebook, cluster_size_init,
// sync_codebook, stochastic_sample_codes, sample_codebook_temp, ema_update,
// affine_param and its decays) into `c`, with their checks. Reads only
// those keys: the caller finishes the section.
void read_codebook_options(ConfigSection& s, CodebookOptions& c);

// A whole quantizer section into `q`: its "type" (q's when absent; a new
// type starts from that type's defaults), then that type's keys starting
// from q's values, checked; finishes the section (unknown keys are errors).
// `dim`, the input width when known (0: not yet), lets sizes that depend on
// it be refused by key here.
void read_quantizer_options(ConfigSection s, QuantizerOptions& q, int64_t dim = 0);

// The options a JSON object describes (as a config's quantizer section),
// errors naming `where`.
QuantizerOptions parse_quantizer_options(const nlohmann::json& j, int64_t dim = 0,
                                         const std::string& where = "quantizer options");

// The Quantizer `q` describes, for inputs of width `dim`. `seed` keys its
// shared random streams (codebook init, k-means, revival, dropout); its
// initial weights (projections, codebooks) are drawn from `init_gen`.
std::shared_ptr<Quantizer> make_quantizer(const QuantizerOptions& q, int64_t dim, uint64_t seed, Generator& init_gen);

}  // namespace vqddp
