#include "vq/codebook_layer.h"

#include "vq/code_logits.h"
#include "vq/codebook_diversity.h"
#include "vq/in_place_codebook_step.h"
#include "vq/orthogonal_reg.h"

namespace vqddp {

std::optional<CodebookLayerStep> codebook_layer_step(Codebook& book, const Tensor& rows, Communicator& comm,
                                                     const CodebookLayerOptions& o, const Tensor& path) {
  std::optional<CodebookAssignment> a = book.nearest(rows, comm, path);
  if (!a) return std::nullopt;  // nobody had rows, on every rank
  const CodebookLossOptions& l = o.loss;
  // A frozen codebook is assigned against (and k-means-initialised) but
  // never changed.
  const bool change = o.training && !l.freeze_codebook;
  if (o.in_place_lr > 0 && change && !o.shared) {
    in_place_codebook_step(book, *a, o.in_place_lr, comm);
    a = book.nearest(rows, comm);
  }
  CodebookLayerStep s{*a, {}, {}, {}, {}};
  if (l.codebook_diversity_loss_weight > 0 && o.training)
    s.diversity = codebook_diversity_loss(book, *a, l.codebook_diversity_temperature, comm);
  if (l.commitment_use_cross_entropy_loss && o.training)
    s.cross_entropy = code_cross_entropy(a->prepared, assigned_codebook(book), book.options().cosine, a->indices, comm);
  if (l.orthogonal_reg_weight > 0 && o.training)
    s.orthogonal = orthogonal_regularizer(book, a->indices, l.orthogonal_reg_active_codes_only,
                                          l.orthogonal_reg_max_codes, comm);
  if (change && !o.shared) s.metrics = book.update(a->prepared, a->indices, comm);
  return s;
}

}  // namespace vqddp
