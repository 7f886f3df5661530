#include "vq/in_place_codebook_step.h"

#include <optional>

#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim.h"

namespace vqddp {

void in_place_codebook_step(Codebook& book, const CodebookAssignment& a, float lr, Communicator& comm) {
  in_place_codebook_step(book, std::vector<CodebookAssignment>{a}, lr, comm);
}

void in_place_codebook_step(Codebook& book, const std::vector<CodebookAssignment>& sets, float lr,
                            Communicator& comm) {
  VQDDP_CHECK(book.options().learnable, "in_place_codebook_step: the codebook is not learnable");
  if (sets.empty()) return;
  // Every set holds this rank's rows (ResidualVQ's layers: the same rows),
  // so one gather of the row counts serves them all.
  const int64_t mine = sets[0].prepared.size(0);
  for (const CodebookAssignment& a : sets)
    VQDDP_CHECK(a.prepared.size(0) == mine, "in_place_codebook_step: row sets of {} and {} rows", mine,
                a.prepared.size(0));
  const std::vector<int64_t> counts = all_gather_counts(comm, mine);
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  if (rows == 0) return;  // no rank has rows: every rank skips alike
  // Outside an exact step (a loop of the caller's own, the trace harness)
  // the step makes its own, one unit per row: the codebook's gradient is
  // then the global batch's, bit for bit 1 rank's, as inside the trainer's.
  std::optional<ExactBatchScope> own;
  if (!exact_batch()) own.emplace(exact_batch_for(comm, std::vector<int64_t>(static_cast<size_t>(mine), 1), counts));
  // Sum over the sets of mean((codes - x)^2) over the global batch's
  // elements: the sums of every rank's rows, over the global count.
  Tensor loss;
  for (const CodebookAssignment& a : sets) {
    const int64_t d = a.prepared.size(1);
    Tensor codes = book.lookup(a.indices, Indices::trusted);
    Tensor sums = batch_sum(square(sub(codes, a.prepared.detach())), comm);  // (D)
    Tensor mean = div(sum(sums), static_cast<float>(rows * d));
    loss = loss.defined() ? add(loss, mean) : mean;
  }
  book.embed.zero_grad();
  loss.backward();
  Sgd sgd({book.embed}, SgdOptions{.lr = lr});  // no momentum: no state to keep
  sgd.step();
  book.embed.zero_grad();
}

}  // namespace vqddp
