#include "tool/reference_quantizer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <set>

#include "engine/count_limits.h"
#include "engine/error.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

struct ClassType {
  const char* class_name;
  const char* type;
};

// The reference's classes and our types for them.
constexpr ClassType kClasses[] = {
    {"VectorQuantize", "vq"},
    {"ResidualVQ", "residual_vq"},
    {"GroupedResidualVQ", "grouped_residual_vq"},
    {"FSQ", "fsq"},
    {"ResidualFSQ", "residual_fsq"},
    {"GroupedResidualFSQ", "grouped_residual_fsq"},
    {"LFQ", "lfq"},
    {"ResidualLFQ", "residual_lfq"},
    {"GroupedResidualLFQ", "grouped_residual_lfq"},
    {"SimVQ", "sim_vq"},
    {"ResidualSimVQ", "residual_sim_vq"},
    {"FSP", "fsp"},
    {"LatentQuantize", "latent_quantize"},
};

std::string without_group(const std::string& type) {
  return type.starts_with("grouped_") ? type.substr(std::string("grouped_").size()) : type;
}

// The reference's constructor defaults where ours differ (VectorQuantize's
// signature, which ResidualVQ and GroupedResidualVQ pass on to their
// layers; LFQ's commitment weight): a key the metadata leaves out means
// what it means there. FSQ and SimVQ already take the reference's defaults
// (quantizer_options.h).
void set_reference_defaults(QuantizerOptions& q, int64_t dim) {
  const std::string base = without_group(q.type);
  if (base == "lfq" || base == "residual_lfq") q.commitment_loss_weight = 0.f;
  if (base != "vq" && base != "residual_vq") return;
  // There each head is codebook_dim wide, dim by default (projected from
  // dim to heads x codebook_dim); ours defaults to dim / heads.
  if (base == "vq") q.codebook_dim = dim;
  q.codebook.decay = 0.8f;
  q.codebook.kmeans_init = false;
  q.codebook.kmeans_iters = 10;
  q.codebook.threshold_ema_dead_code = 0.f;
  q.codebook.cluster_size_init_ones = true;
  q.commitment_weight = 1.f;
  q.rotation_trick = dim > 1;  // the reference: on unless the feature dimension is 1
}

bool is_codebook_leaf(const std::string& leaf) {
  return leaf == "embed" || leaf == "embed_avg" || leaf == "cluster_size" || leaf == "initted";
}

// The slots of one tensor of a quantizer of type `base` (no group prefix).
std::vector<ReferenceSlot> slots_of(const std::string& base, const QuantizerOptions& q, const std::string& ours) {
  using L = ReferenceSlot::Layout;
  const size_t dot = ours.rfind('.');
  const std::string leaf = dot == std::string::npos ? ours : ours.substr(dot + 1);
  const std::string owner = dot == std::string::npos ? "" : ours.substr(0, dot);
  if (leaf == "draws" || leaf == "dropout_step" || leaf == "perturb_step") return {{ours, "vqddp." + ours, L::ours_only}};
  if (owner == "project_in_norm") return {{ours, "project_in.1." + leaf}};
  if (owner == "project_in" && q.layernorm_after_project_in) return {{ours, "project_in.0." + leaf}};
  // A codebook's tensors (its own, or its affine statistics'), under each
  // place the reference holds that codebook.
  const bool affine = owner.ends_with(".affine");
  const std::string book = affine ? owner.substr(0, owner.size() - std::string(".affine").size()) : owner;
  if (!affine && !is_codebook_leaf(leaf)) return {{ours, ours}};
  struct Place {
    std::string prefix;
    int64_t head = 0, heads = 1;  // heads > 1: separate codebooks, stacked there
  };
  std::vector<Place> places;
  if (base == "vq") {
    if (book == "codebook") places.push_back({"_codebook."});
    else places.push_back({"_codebook.", std::stoll(book.substr(std::string("codebook").size())), q.heads});  // codebook<h>
  } else if (base == "residual_vq") {
    if (book == "codebook") {  // shared: the reference holds it under every layer
      for (int l = 0; l < q.num_quantizers; ++l) places.push_back({fmt::format("layers.{}._codebook.", l)});
    } else {
      places.push_back({fmt::format("layers.{}._codebook.", book.substr(std::string("layer").size()))});  // layer<l>
    }
  } else {
    return {{ours, ours}};
  }
  std::vector<ReferenceSlot> out;
  for (const Place& p : places) {
    if (leaf == "initted") {
      out.push_back({ours, p.prefix + leaf, L::flag});
    } else if (!affine) {
      out.push_back({ours, p.prefix + leaf, p.heads > 1 ? L::head : L::leading_one, p.head, p.heads});
    } else if (leaf == "batch_needs_init") {
      out.push_back({ours, "vqddp." + ours, L::ours_only});  // the reference tells by the statistics' absence
    } else if (leaf == "codebook_needs_init") {  // one flag for the reference's two
      out.push_back({ours, p.prefix + "codebook_mean_needs_init", L::flag});
      out.push_back({ours, p.prefix + "codebook_variance_needs_init", L::flag});
    } else {
      ReferenceSlot s{ours, p.prefix + leaf, L::head_row, p.head, p.heads};
      s.optional = leaf == "batch_mean" || leaf == "batch_variance";  // None there until the first forward
      out.push_back(s);
    }
  }
  return out;
}

Shape reference_shape(const ReferenceSlot& s, const Shape& ours) {
  using L = ReferenceSlot::Layout;
  Shape out = ours;
  switch (s.layout) {
    case L::leading_one: out.insert(out.begin(), 1); break;
    case L::head: out.insert(out.begin(), s.heads); break;
    case L::head_row: out.insert(out.begin(), {s.heads, 1}); break;
    case L::flag: out = {}; break;
    default: break;
  }
  return out;
}

// Our tensor's value from the reference's tensor `t` (already checked).
Tensor our_value(const ReferenceSlot& s, const Tensor& t, const Shape& ours) {
  if (s.layout == ReferenceSlot::Layout::head || s.layout == ReferenceSlot::Layout::head_row)
    return t.slice_rows(s.head, s.head + 1).reshape(ours);
  return t.reshape(ours);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor ca = a.clone(), cb = b.clone();  // contiguous host copies
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

NamedTensors state_of(const Module& m) {
  NamedTensors all = m.named_parameters();
  for (auto& b : m.named_buffers()) all.push_back(b);
  return all;
}

}  // namespace

const std::vector<std::string>& reference_classes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const ClassType& c : kClasses) n.push_back(c.class_name);
    return n;
  }();
  return names;
}

ReferenceQuantizer reference_quantizer(const std::map<std::string, std::string>& metadata, const std::string& file) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, v] : metadata) {
    nlohmann::json parsed = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
    j[key] = parsed.is_discarded() ? nlohmann::json(v) : parsed;
  }
  ConfigSection s(j, "", file + " metadata");
  ReferenceQuantizer r;
  r.class_name = s.choice("class", "", reference_classes());
  for (const ClassType& c : kClasses)
    if (r.class_name == c.class_name) r.options.type = c.type;
  j["type"] = r.options.type;  // our reader's key for the class (it finishes the section)
  const std::string base = without_group(r.options.type);
  // FSQ and LFQ may leave dim out: the reference then takes the code width.
  const bool dim_optional = base == "fsq" || base == "lfq" || base == "fsp";
  if (!j.contains("dim") && !dim_optional) s.fail("dim", "is required for class " + r.class_name);
  r.dim = s.integer("dim", 0, limits::width);
  r.seed = s.unsigned_integer("seed", 0);
  set_reference_defaults(r.options, r.dim);
  read_quantizer_options(s, r.options);
  if (r.dim == 0) {
    if (base == "fsq") r.dim = static_cast<int64_t>(r.options.levels.size()) * r.options.num_codebooks;
    else if (base == "fsp") r.dim = static_cast<int64_t>(r.options.levels.size());
    else r.dim = static_cast<int64_t>(std::llround(std::log2(static_cast<double>(r.options.codebook_size))));
  }
  if (r.options.codebook.learnable)
    s.fail("learnable_codebook", "must be false: replay steps no optimizer, so a learnable codebook would not train");
  return r;
}

std::vector<ReferenceSlot> reference_slots(const QuantizerOptions& q, const Module& m) {
  std::vector<ReferenceSlot> slots;
  const std::string base = without_group(q.type);
  for (const auto& [name, t] : state_of(m)) {
    std::string prefix, rest = name;
    if (q.type.starts_with("grouped_")) {  // rvqs.<g>.<the residual quantizer's name>
      size_t second = name.find('.', std::string("rvqs.").size());
      prefix = name.substr(0, second + 1);
      rest = name.substr(second + 1);
    }
    for (ReferenceSlot s : slots_of(base, q, rest)) {
      s.ours = prefix + s.ours;
      s.theirs = s.layout == ReferenceSlot::Layout::ours_only ? "vqddp." + prefix + rest : prefix + s.theirs;
      slots.push_back(s);
    }
  }
  return slots;
}

bool is_reference_constant(const QuantizerOptions& q, const std::string& name) {
  // LFQ registers its bit weights 2^(d-1) .. 1 as a persistent buffer.
  const std::string base = without_group(q.type);
  return (base == "lfq" || base == "residual_lfq") && (name == "mask" || name.ends_with(".mask"));
}

std::vector<std::string> load_reference_state(Module& m, const std::vector<ReferenceSlot>& slots,
                                              const SafetensorsFile& f) {
  std::map<std::string, Tensor> ours;
  for (auto& [name, t] : state_of(m)) ours.emplace(name, t);
  std::vector<std::string> read;
  std::set<std::string> loaded;
  for (const ReferenceSlot& s : slots) {
    Tensor& dst = ours.at(s.ours);
    if (!f.contains(s.theirs)) {
      if (s.layout == ReferenceSlot::Layout::ours_only || s.optional) continue;  // the initial value stays
      VQDDP_THROW("{}: missing tensor '{}' (the reference's name for {} {}; the file must hold the module's whole "
                  "state_dict)",
                  f.path, s.theirs, shape_str(dst.shape()), s.ours);
    }
    const Tensor& src = f.at(s.theirs);
    const Shape want = reference_shape(s, dst.shape());
    VQDDP_CHECK(src.shape() == want && src.dtype() == dst.dtype(),
                "{}: '{}' must be {} {} (the reference's layout of {}), got {}", f.path, s.theirs,
                dtype_name(dst.dtype()), shape_str(want), s.ours, src.desc());
    Tensor value = our_value(s, src, dst.shape());
    if (loaded.insert(s.ours).second) {
      dst.copy_(value);
    } else {
      VQDDP_CHECK(same_bytes(dst, value), "{}: '{}' differs from the other copies of shared {} (one tensor there)",
                  f.path, s.theirs, s.ours);
    }
    read.push_back(s.theirs);
  }
  return read;
}

NamedTensors to_reference(const NamedTensors& tensors, const std::vector<ReferenceSlot>& slots) {
  std::map<std::string, Tensor> ours(tensors.begin(), tensors.end());
  NamedTensors out;
  std::map<std::string, std::vector<Tensor>> heads;  // stacked per name, in head order
  auto written = [&out](const std::string& name) {
    for (auto& [n, v] : out)
      if (n == name) return true;
    return false;
  };
  for (const ReferenceSlot& s : slots) {
    auto it = ours.find(s.ours);
    if (it == ours.end()) continue;
    const Tensor& t = it->second;
    if (s.layout == ReferenceSlot::Layout::head || s.layout == ReferenceSlot::Layout::head_row) {
      auto& rows = heads[s.theirs];
      if (rows.empty()) out.emplace_back(s.theirs, Tensor());  // its place; filled below
      ReferenceSlot one = s;
      one.heads = 1;  // this head's piece: a leading axis of 1
      rows.push_back(t.clone().reshape(reference_shape(one, t.shape())));
    } else if (!written(s.theirs)) {  // heads share one `initted`
      out.emplace_back(s.theirs, t.clone().reshape(reference_shape(s, t.shape())));
    }
  }
  for (auto& [name, v] : out)
    if (!v.defined()) v = concat(heads.at(name), 0);
  return out;
}

NamedTensors reference_state(const Module& m, const std::vector<ReferenceSlot>& slots) {
  return to_reference(state_of(m), slots);
}

}  // namespace vqddp
