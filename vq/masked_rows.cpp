#include "vq/masked_rows.h"

#include "engine/exact_batch.h"
#include "engine/ops.h"

namespace vqddp {

MaskedRows::MaskedRows(const Tensor& mask, int64_t rows, int rank) : rows_(rows) {
  if (!mask.defined()) return;
  // Kept rows differ per example, so the batch's units (engine/exact_batch.h)
  // would no longer be whole rows per example: refused rather than summed
  // by the wrong units.
  VQDDP_CHECK(exact_batch() == nullptr, "rank {}: a quantizer mask cannot be used in an exact step (the masked rows "
              "break the batch's units); train masked data outside ExactBatchScope", rank);
  VQDDP_CHECK(mask.dtype() == DType::i64 && mask.shape() == Shape{rows}, "rank {}: mask must be int64 [{}], got {}",
              rank, rows, mask.desc());
  // The row lists are built on the host (the mask is read once); index
  // tensors follow the data to its device where they are used.
  std::vector<int64_t> kept;
  const std::vector<int64_t> pm = mask.to_vector<int64_t>();
  for (int64_t i = 0; i < rows; ++i)
    if (pm[i] != 0) kept.push_back(i);
  keep_ = from_vector(kept, {static_cast<int64_t>(kept.size())});
}

Tensor MaskedRows::compact(const Tensor& x) const { return active() ? index_select(x, keep_.to(x.device()), Indices::trusted) : x; }

Tensor MaskedRows::expand(const Tensor& y, const Tensor& x) const {
  if (!active()) return y;
  // Rows of concat(y, x): kept row j of the batch is y's row, masked row i is
  // x's row i (at M + i).
  int64_t m = keep_.numel();
  std::vector<int64_t> gather(rows_);
  for (int64_t i = 0; i < rows_; ++i) gather[i] = m + i;
  const int64_t* pk = keep_.data<int64_t>();
  for (int64_t j = 0; j < m; ++j) gather[pk[j]] = j;
  return index_select(concat({y, x}, 0), from_vector(gather, {rows_}).to(x.device()), Indices::trusted);
}

Tensor MaskedRows::expand_indices(const Tensor& indices) const {
  if (!active()) return indices;
  // The same gather as expand, with -1 in place of the input rows.
  Shape shape = indices.shape();
  shape[0] = rows_;
  return expand(indices, full(shape, -1, DType::i64, indices.device()));
}

}  // namespace vqddp
