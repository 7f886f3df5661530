#include "tool/reference_quantizer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <set>

#include "engine/core/count_limits.h"
#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

// The slots of one tensor of ours: what every type shares (our own draws
// and step counters, kept as "vqddp.<name>"), then the type's mapping.
std::vector<ReferenceSlot> slots_of(const QuantizerOptions& q, const std::string& ours) {
  const std::string leaf = ours.substr(ours.rfind('.') + 1);
  if (leaf == "draws" || leaf == "dropout_step" || leaf == "perturb_step")
    return {{ours, "vqddp." + ours, ReferenceSlot::Layout::ours_only}};
  const QuantizerKind& kind = q.kind();
  return kind.reference_slots ? kind.reference_slots(q, ours) : std::vector<ReferenceSlot>{{ours, ours}};
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
    for (const QuantizerKind* k : quantizer_kinds())
      if (!k->reference_class.empty()) n.push_back(k->reference_class);
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
  const QuantizerKind* kind = nullptr;
  for (const QuantizerKind* k : quantizer_kinds())
    if (k->reference_class == r.class_name) kind = k;
  j["type"] = kind->type;  // our reader's key for the class (it finishes the section)
  // Some classes may leave dim out: the reference then takes the code width.
  if (!j.contains("dim") && !kind->reference_dim) s.fail("dim", "is required for class " + r.class_name);
  r.dim = s.integer("dim", 0, limits::input_width);
  r.seed = s.unsigned_integer("seed", 0);
  r.options = kind->defaults();
  if (kind->reference_defaults) kind->reference_defaults(r.options, r.dim);
  read_quantizer_options(s, r.options, r.dim);
  if (r.dim == 0) r.dim = kind->reference_dim(r.options);
  if (r.options.codebook() && r.options.codebook()->learnable)
    s.fail("learnable_codebook", "must be false: replay steps no optimizer, so a learnable codebook would not train");
  return r;
}

std::vector<ReferenceSlot> reference_slots(const QuantizerOptions& q, const Module& m) {
  std::vector<ReferenceSlot> slots;
  for (const auto& [name, t] : state_of(m))
    for (const ReferenceSlot& s : slots_of(q, name)) slots.push_back(s);
  return slots;
}

bool is_reference_constant(const QuantizerOptions& q, const std::string& name) {
  const QuantizerKind& kind = q.kind();
  return kind.reference_constant && kind.reference_constant(name);
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
