#include "vq/orthogonal_reg.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "vq/losses.h"

namespace vqddp {

Tensor orthogonal_loss(const Tensor& codes) {
  const float n = static_cast<float>(codes.size(0));
  Tensor normed = l2_normalize_rows(codes);
  Tensor cosine = matmul(normed, normed, false, true);  // (n, n)
  return sub(div(sum(square(cosine)), n * n), 1.f / n);
}

Tensor orthogonal_regularizer(Codebook& book, const Tensor& indices, bool active_only, int64_t max_codes,
                              Communicator& comm) {
  const int64_t k = book.options().codebook_size;
  std::vector<int64_t> rows(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) rows[j] = j;
  if (active_only) {
    // Codes some rank's rows chose: counts summed over ranks (host numbers;
    // on a device the indices are read back, a documented cost of the option).
    Tensor counts = zeros({k}, DType::f64);
    for (int64_t i : indices.to(Device::cpu()).to_vector<int64_t>())
      if (i >= 0) counts.data<double>()[i] += 1.0;
    comm.all_reduce(counts, ReduceOp::sum);
    rows.clear();
    for (int64_t j = 0; j < k; ++j)
      if (counts.data<double>()[j] > 0) rows.push_back(j);
  }
  if (max_codes > 0 && static_cast<int64_t>(rows.size()) > max_codes) {
    Generator gen = book.draw_stream();
    std::vector<int64_t> order = random_permutation(static_cast<int64_t>(rows.size()), gen);
    std::vector<int64_t> picked;
    for (int64_t i = 0; i < max_codes; ++i) picked.push_back(rows[order[i]]);
    rows = picked;
  }
  Tensor codes = book.embed;  // the parameter (a learnable codebook's gradient reaches it)
  Tensor loss;
  if (rows.empty()) {
    loss = mul(sum(codes), 0.f);
  } else {
    if (static_cast<int64_t>(rows.size()) < k)
      codes = index_select(codes, mark_batch_free(from_vector(rows, {static_cast<int64_t>(rows.size())}).to(codes.device())));
    loss = orthogonal_loss(codes);
  }
  // A batch-free scalar joins the batch's losses as the global mean of its
  // value on every row: the same value (a mean of equal terms), and in an
  // exact step its gradient counted once over the global batch, not once
  // per rank.
  const Device dev = codes.device();
  return global_mean_or_zero(mul(full({indices.size(0), 1}, 1.0, DType::f32, dev), reshape(loss, {1, 1})), comm);
}

}  // namespace vqddp
