#include "vq/codebook_diversity.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/losses.h"

namespace vqddp {

Tensor codebook_diversity_loss(const Tensor& rows, const Tensor& codes, bool cosine, float temperature,
                               Communicator& comm) {
  Tensor dots = matmul(rows, codes, false, true);  // (M, K)
  Tensor scores;
  if (cosine) {
    scores = dots;
  } else {
    // |x - e|^2 = |x|^2 - 2 x.e + |e|^2, clamped at a tiny positive value
    // so that the root's gradient stays finite where a row sits on a code.
    Tensor x2 = sum(square(rows), 1, /*keepdim=*/true);                        // (M, 1)
    Tensor e2 = reshape(sum(square(codes), 1, /*keepdim=*/false), {1, -1});    // (1, K)
    scores = neg(vqddp::sqrt(clamp(add(sub(x2, mul(dots, 2.f)), e2), 1e-20f, 3.4e38f)));
  }
  Tensor p = softmax_rows(mul(scores, temperature));
  return neg(entropy_rows(global_row_mean(p, comm)));
}

Tensor codebook_diversity_loss(const Codebook& book, const CodebookAssignment& a, float temperature,
                               Communicator& comm) {
  // The copy is the same on every rank: batch-free (engine/exact_batch.h).
  // A learnable codebook is not written by the update, and its loss reaches
  // the embed.
  Tensor codes = book.options().learnable ? book.codes() : mark_batch_free(book.codes().clone());
  return codebook_diversity_loss(a.prepared, codes, book.options().cosine, temperature, comm);
}

}  // namespace vqddp
