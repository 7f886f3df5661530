#include "vq/codebook_diversity.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/code_logits.h"
#include "vq/losses.h"

namespace vqddp {

Tensor codebook_diversity_loss(const Tensor& rows, const Tensor& codes, bool cosine, float temperature,
                               Communicator& comm) {
  Tensor scores = code_logits(rows, codes, cosine);  // (M, K)
  Tensor p = softmax_rows(mul(scores, temperature));
  return neg(entropy_rows(global_row_mean(p, comm)));
}

Tensor codebook_diversity_loss(const Codebook& book, const CodebookAssignment& a, float temperature,
                               Communicator& comm) {
  return codebook_diversity_loss(a.prepared, assigned_codebook(book), book.options().cosine, temperature, comm);
}

}  // namespace vqddp
