#include "vq/grouped.h"

#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "engine/core/error.h"
#include "engine/ops.h"
#include "vq/index_columns.h"
#include "vq/quantizer_registry.h"

namespace vqddp {

GroupedQuantizer::GroupedQuantizer(std::vector<std::shared_ptr<Quantizer>> groups) : groups_(std::move(groups)) {
  VQDDP_CHECK(!groups_.empty(), "GroupedQuantizer: needs at least one group");
  group_dim_ = groups_[0]->dim();
  group_columns_ = static_cast<int64_t>(groups_[0]->layer_sizes().size());
  auto rvqs = register_module("rvqs", std::make_shared<ModuleList>());
  for (size_t g = 0; g < groups_.size(); ++g) {
    VQDDP_CHECK(groups_[g]->dim() == group_dim_ && static_cast<int64_t>(groups_[g]->layer_sizes().size()) == group_columns_,
                "GroupedQuantizer: group {} has width {} and {} index columns, group 0 {} and {}", g,
                groups_[g]->dim(), groups_[g]->layer_sizes().size(), group_dim_, group_columns_);
    rvqs->append(groups_[g]);
  }
}

Tensor GroupedQuantizer::group_major(const Tensor& x) const {
  const int64_t n = x.size(0), groups = num_groups();
  // (N, G, d) -> (G, N, d): group g's columns are then rows g*N .. (g+1)*N.
  return groups == 1 ? x : reshape(transpose(reshape(x, {n, groups, group_dim_}), 0, 1), {groups * n, group_dim_});
}

QuantizerOutput GroupedQuantizer::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == dim(), "rank {}: the grouped quantizer expects [N, {}], got {}",
              comm.rank(), dim(), x.desc());
  const int64_t n = x.size(0), groups = num_groups();
  QuantizerOutput out;
  std::vector<Tensor> quantized, index_columns;
  out.loss = full({}, 0.0, DType::f32, x.device());
  const Tensor by_group = group_major(x);  // one transpose for all groups
  for (int g = 0; g < groups; ++g) {
    QuantizerOutput o = groups_[g]->quantize(slice_rows(by_group, g * n, (g + 1) * n), comm, mask);
    quantized.push_back(o.quantized);
    for (Tensor& c : split_columns(o.indices)) index_columns.push_back(c);
    out.loss = add(out.loss, o.loss);
    out.layer_losses.insert(out.layer_losses.end(), o.layer_losses.begin(), o.layer_losses.end());
    out.metrics.insert(out.metrics.end(), o.metrics.begin(), o.metrics.end());
    out.active_layers += o.active_layers;
    for (auto& [name, t] : o.extras) out.extras["rvqs." + std::to_string(g) + "." + name] = t;
  }
  // (G, N, d) -> (N, G*d): the groups' columns back in feature order.
  out.quantized = groups == 1 ? quantized[0]
                              : reshape(transpose(reshape(concat(quantized, 0), {groups, n, group_dim_}), 0, 1),
                                        {n, groups * group_dim_});
  out.indices = stack_columns(index_columns);
  return out;
}

Tensor GroupedQuantizer::decode(const Tensor& indices) const {
  const int64_t groups = num_groups();
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == groups * group_columns_,
              "grouped quantizer decode: expected int64 indices [N, {}], got {}", groups * group_columns_,
              indices.desc());
  const int64_t n = indices.size(0);
  std::vector<Tensor> columns = split_columns(indices), decoded;
  for (int g = 0; g < groups; ++g) {
    std::vector<Tensor> mine(columns.begin() + g * group_columns_, columns.begin() + (g + 1) * group_columns_);
    decoded.push_back(groups_[g]->decode(stack_columns(mine)));
  }
  if (groups == 1) return decoded[0];
  return reshape(transpose(reshape(concat(decoded, 0), {groups, n, group_dim_}), 0, 1), {n, groups * group_dim_});
}

std::vector<int64_t> GroupedQuantizer::layer_sizes() const {
  std::vector<int64_t> sizes;
  for (const auto& g : groups_) {
    std::vector<int64_t> s = g->layer_sizes();
    sizes.insert(sizes.end(), s.begin(), s.end());
  }
  return sizes;
}

// ---- the grouped kinds (vq/quantizer_kind.h) --------------------------------------

namespace {

// "grouped_" + `inner`'s type: the inner type's keys and `groups`; each
// group its own codebook streams, one dropout stream for all.
QuantizerKind grouped_kind(const QuantizerKind& inner) {
  QuantizerKind k;
  k.type = "grouped_" + inner.type;
  k.defaults = [&inner, type = k.type] { return QuantizerOptions(type, GroupedOptions{1, inner.defaults()}); };
  k.read = [&inner](ConfigSection& s, QuantizerOptions& q, int64_t dim) {
    auto& o = q.as<GroupedOptions>();
    o.groups = static_cast<int>(s.integer("groups", o.groups, limits::heads));
    if (dim > 0 && dim % o.groups != 0)
      s.fail("groups", fmt::format("must divide the input width ({}; model.latent_dim in a config), got {}", dim, o.groups));
    inner.read(s, o.inner, dim > 0 ? dim / o.groups : 0);
  };
  k.make = [&inner](const QuantizerOptions& q, const QuantizerBuild& b) -> std::shared_ptr<Quantizer> {
    const auto& o = q.as<GroupedOptions>();
    VQDDP_CHECK(o.groups >= 1 && b.dim % o.groups == 0, "make_quantizer: groups {} must divide the input width {}",
                o.groups, b.dim);
    std::vector<std::shared_ptr<Quantizer>> groups;
    for (int g = 0; g < o.groups; ++g)
      groups.push_back(inner.make(o.inner, QuantizerBuild{b.dim / o.groups, codebook_seed(b.seed, g), b.seed, b.gen}));
    return std::make_shared<GroupedQuantizer>(std::move(groups));
  };
  k.test_keys = inner.test_keys;
  k.test_keys["groups"] = 2;
  k.reference_class = "Grouped" + inner.reference_class;
  if (inner.reference_defaults)
    k.reference_defaults = [&inner](QuantizerOptions& q, int64_t dim) {
      inner.reference_defaults(q.as<GroupedOptions>().inner, dim);
    };
  // rvqs.<g>.<the group's name>
  k.reference_slots = [&inner](const QuantizerOptions& q, const std::string& ours) {
    const size_t second = ours.find('.', std::string("rvqs.").size());
    const std::string prefix = ours.substr(0, second + 1), rest = ours.substr(second + 1);
    return nested_slots(inner, q.as<GroupedOptions>().inner, prefix, rest);
  };
  k.reference_constant = inner.reference_constant;
  return k;
}

}  // namespace

const QuantizerKind& grouped_residual_vq_kind() {
  static const QuantizerKind kind = grouped_kind(residual_vq_kind());
  return kind;
}

const QuantizerKind& grouped_residual_fsq_kind() {
  static const QuantizerKind kind = grouped_kind(residual_fsq_kind());
  return kind;
}

const QuantizerKind& grouped_residual_lfq_kind() {
  static const QuantizerKind kind = grouped_kind(residual_lfq_kind());
  return kind;
}

}  // namespace vqddp
