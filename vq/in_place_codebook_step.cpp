#include "vq/in_place_codebook_step.h"

#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim.h"

namespace vqddp {

void in_place_codebook_step(Codebook& book, const CodebookAssignment& a, float lr, Communicator& comm) {
  VQDDP_CHECK(book.options().learnable, "in_place_codebook_step: the codebook is not learnable");
  const int64_t d = a.codes.size(1);
  int64_t rows = 0;
  for (int64_t n : all_gather_counts(comm, a.codes.size(0))) rows += n;
  if (rows == 0) return;  // no rank has rows: every rank skips alike
  // mean((codes - x)^2) over the global batch's elements: the sums of every
  // rank's rows, over the global count.
  Tensor sums = batch_sum(square(sub(a.codes, a.prepared.detach())), comm);  // (D)
  Tensor loss = div(sum(sums), static_cast<float>(rows * d));
  book.embed.zero_grad();
  loss.backward();
  Sgd sgd({book.embed}, SgdOptions{.lr = lr});  // no momentum: no state to keep
  sgd.step();
  book.embed.zero_grad();
}

}  // namespace vqddp
