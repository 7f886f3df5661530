#include "vq/index_columns.h"

#include "engine/ops.h"
#include "vq/masked_rows.h"

namespace vqddp {

Tensor stack_columns(const std::vector<Tensor>& columns) {
  int64_t q = static_cast<int64_t>(columns.size()), n = columns.at(0).numel();
  return transpose(reshape(concat(columns, 0), {q, n}));
}

std::vector<Tensor> split_columns(const Tensor& indices) {
  VQDDP_CHECK(indices.dim() == 2, "split_columns: expected indices (N, Q), got {}", indices.desc());
  Tensor by_column = transpose(indices);  // (Q, N), one copy
  std::vector<Tensor> out;
  for (int64_t l = 0; l < by_column.size(0); ++l) out.push_back(by_column.slice_rows(l, l + 1).reshape({-1}));
  return out;
}

Tensor codes_or_zero(const Tensor& indices, int64_t width, const std::function<Tensor(const Tensor&)>& lookup) {
  int64_t n = indices.numel();
  std::vector<int64_t> valid;
  for (int64_t v : indices.to_vector<int64_t>()) valid.push_back(v >= 0 ? 1 : 0);
  // The -1 entries are masked rows: looked up without them, put back as zeros.
  MaskedRows rows(from_vector(valid, {n}), n, 0);
  Tensor codes = lookup(rows.compact(indices));
  return rows.expand(codes, zeros({n, width}, DType::f32, codes.device()));
}

}  // namespace vqddp
