// The grouped quantizers of vector-quantize-pytorch: GroupedResidualVQ,
// GroupedResidualFSQ and GroupedResidualLFQ. The input's features split
// into `groups` equal chunks; chunk g (columns g*dim/G .. (g+1)*dim/G) is
// quantized by its own residual quantizer of width dim / G, and the outputs
// are concatenated back in feature order.
//
//   indices (N, G*Q), group-major (column g*Q + l: group g, layer l);
//   layer_sizes, layer_losses and metrics the groups' in group order; loss
//   their sum; active_layers the groups' sum.
//
// DDP: each group is its residual quantizer, with its rules; the groups run
// in order, so every rank issues the same collectives in the same order.
// Quantize dropout draws from one stream key for all groups (made so by
// make_quantizer): every group drops the same layers in a step, as the
// reference's grouped forms share one dropout seed. Each group's codebooks
// have streams of their own. State names: rvqs.<g>.<the group's names>.
#pragma once

#include <memory>
#include <vector>

#include "vq/quantizer.h"
#include "vq/quantizer_options.h"

namespace vqddp {

// The options of a grouped type ("grouped_" + a residual type): the group
// count and the options every group's quantizer takes (width dim / groups).
struct GroupedOptions {
  int groups = 1;
  QuantizerOptions inner;
  bool operator==(const GroupedOptions&) const = default;
};

class GroupedQuantizer : public Quantizer {
 public:
  // `groups`: G >= 1 quantizers of one input width and one number of index
  // columns (make_quantizer's "grouped_*" types make them).
  explicit GroupedQuantizer(std::vector<std::shared_ptr<Quantizer>> groups);

  // The contract (vq/quantizer.h); the mask goes to every group (codebook
  // quantizers skip masked rows, FSQ and LFQ forms refuse one).
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override;
  int64_t dim() const override { return group_dim_ * static_cast<int64_t>(groups_.size()); }

  int num_groups() const { return static_cast<int>(groups_.size()); }
  const Quantizer& group(int g) const { return *groups_.at(g); }

 private:
  // x (N, dim) group-major, (G * N, group_dim): rows g*N .. (g+1)*N are
  // group g's columns.
  Tensor group_major(const Tensor& x) const;

  std::vector<std::shared_ptr<Quantizer>> groups_;
  int64_t group_dim_ = 0;
  int64_t group_columns_ = 0;  // index columns per group
};

}  // namespace vqddp
