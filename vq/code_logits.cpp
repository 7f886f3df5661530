#include "vq/code_logits.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/losses.h"

namespace vqddp {

Tensor code_logits(const Tensor& rows, const Tensor& codes, bool cosine) {
  Tensor dots = matmul(rows, codes, false, true);  // (M, K)
  if (cosine) return dots;
  Tensor x2 = sum(square(rows), 1, /*keepdim=*/true);                      // (M, 1)
  Tensor e2 = reshape(sum(square(codes), 1, /*keepdim=*/false), {1, -1});  // (1, K)
  return neg(vqddp::sqrt(clamp(add(sub(x2, mul(dots, 2.f)), e2), 1e-8f, 3.4e38f)));
}

Tensor assigned_codebook(const Codebook& book) {
  return book.options().learnable ? book.codes() : mark_batch_free(book.codes().clone());
}

Tensor code_cross_entropy(const Tensor& rows, const Tensor& codes, bool cosine, const Tensor& indices,
                          Communicator& comm) {
  const int64_t k = codes.size(0);
  Tensor s = code_logits(rows, codes, cosine);  // (M, K)
  // The picked logit through a one-hot row of the identity (a gather that
  // stays on the device): one product by 1 and zeros, so exactly s[n, i_n].
  Tensor eye = zeros({k, k});
  for (int64_t j = 0; j < k; ++j) eye.data<float>()[j * k + j] = 1.f;
  Tensor one_hot = index_select(mark_batch_free(eye.to(rows.device())), indices, Indices::trusted);  // (M, K)
  Tensor picked = sum(mul(s, one_hot), 1, /*keepdim=*/true);                                         // (M, 1)
  Tensor top = max_last(s);                                                                          // (M, 1), constant
  Tensor lse = add(log(sum(exp(sub(s, top)), 1, /*keepdim=*/true)), top);
  return global_mean_or_zero(sub(lse, picked), comm);
}

}  // namespace vqddp
