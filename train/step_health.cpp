#include "train/step_health.h"

#include <fmt/format.h>

#include <cmath>

#include "comm/agree.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/code_stats.h"
#include "vq/index_columns.h"

namespace vqddp {

// The losses are the global batch's already (an exact step's means are
// global on every rank): one read each. The code usage comes from the
// codebooks' own global counts (CodebookMetrics: one read per layer), or,
// for quantizers without per-layer codebooks (FSQ, a shared codebook), from
// the layers' indices counted on the device, all-reduced together (whole
// counts: exact in any order) and read once per layer. Every rank gets the
// same numbers, so a non-finite loss or a flagged row throws on every rank
// alike.
StepLog step_log(const ModelOutput& out, const Tensor& loss, const std::vector<Tensor>& adversarial,
                 const std::vector<int64_t>& sizes, Communicator& comm) {
  NoGradGuard no_grad;
  const Device dev = loss.device();
  StepLog log;
  std::vector<Tensor> parts{reshape(loss, {1}), reshape(out.reconstruction_loss, {1}), reshape(out.quantizer_loss, {1})};
  for (const Tensor& t : adversarial) parts.push_back(reshape(t.detach(), {1}));
  const std::vector<float> losses = concat(parts).to_vector<float>();
  log.loss = losses[0];
  log.recon = losses[1];
  log.quantizer = losses[2];
  if (adversarial.size() >= 2) log.adversarial = losses[3], log.feature = losses[4];
  if (adversarial.size() == 3) log.discriminator = losses[5];
  std::vector<CodebookMetrics> layers;
  for (const CodebookMetrics& m : out.metrics) log.revived += m.codes_revived();
  if (out.metrics.size() == sizes.size()) {
    layers = out.metrics;
  } else {
    std::vector<Tensor> columns = split_columns(out.indices), stats;
    std::vector<StatsLayout> layouts;
    for (size_t l = 0; l < sizes.size(); ++l) {
      layouts.push_back({sizes[l], 0, comm.world_size()});
      Tensor none = empty({columns[l].size(0), 0}, DType::f32, dev);  // counts only
      stats.push_back(code_stats(none, columns[l], layouts.back(), comm.rank()));
    }
    Tensor all = concat(stats);
    comm.all_reduce(all, ReduceOp::sum);
    for (size_t l = 0, at = 0; l < sizes.size(); at += layouts[l].size(), ++l)
      layers.push_back(CodebookMetrics::on_device(slice_rows(all, at, at + layouts[l].size()), layouts[l]));
  }
  for (size_t l = 0; l < sizes.size(); ++l)
    log.usage.push_back({layers[l].perplexity(), layers[l].codes_used(), sizes[l]});
  if (!std::isfinite(log.loss))
    VQDDP_THROW_NONFINITE("the loss of the global batch is not finite ({})", log.loss);
  return log;
}

std::string nonfinite_origin(const Tensor& host_batch, const CodecModel& model) {
  if (int64_t at = first_nonfinite(host_batch); at >= 0)
    return fmt::format("the data batch itself holds a non-finite value (row {} of this rank's share)",
                       at / host_batch.size(1));
  float largest = 0;
  std::string largest_name;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor h = p.detach().to(Device::cpu());
    if (std::string bad = value_range_violation(h, {}); !bad.empty())
      return fmt::format("the data batch is finite; parameter '{}' holds {} (the updates diverged: a smaller "
                         "optimizer.lr or grad_clip may help)", name, bad);
    for (int64_t i = 0; i < h.numel(); ++i)
      if (std::fabs(h.data<float>()[i]) > largest) largest = std::fabs(h.data<float>()[i]), largest_name = name;
  }
  return fmt::format("the data batch and every parameter are finite, but the forward pass overflowed float32 "
                     "(largest parameter value {:.3g} in '{}': the updates diverged, a smaller optimizer.lr or "
                     "grad_clip may help)", largest, largest_name);
}

StepHealth::StepHealth(Device device) : flag_(zeros({}, DType::f32, device)) {}

void StepHealth::note(const Tensor& loss) { flag_.copy_(add(flag_, sub(loss.detach(), loss.detach()))); }

void StepHealth::check(Communicator& comm, int64_t checked, int64_t done, const Tensor& host_batch,
                       const CodecModel& model) const {
  Tensor all = reshape(flag_.detach(), {1}).clone();
  comm.all_reduce(all, ReduceOp::sum);
  if (std::isfinite(all.item<float>())) return;
  bool mine = !std::isfinite(flag_.item<float>());
  VQDDP_THROW_NONFINITE_EVERY_RANK("a training loss was not finite at a step in ({}, {}]{}; nothing after step {} is written; {}",
                        checked, done, mine ? fmt::format(" on rank {}", comm.rank()) : " on another rank", checked,
                        nonfinite_origin(host_batch, model));
}

}  // namespace vqddp
