// Variable-length input: rows with mask 0 are taken out before quantizing
// and put back afterwards, so they reach no statistic, no k-means and no
// sampler, keep their input as output and get index -1.
// Internal header: not installed with the library (the quantizers' mask handling).
#pragma once

#include "engine/core/tensor.h"

namespace vqddp {

class MaskedRows {
 public:
  // mask: undefined (keep all rows) or int64 (N) with 1 = keep, 0 = masked.
  MaskedRows(const Tensor& mask, int64_t rows, int rank);

  bool active() const { return keep_.defined(); }
  // (N, C) -> (M, C): the kept rows (differentiable).
  Tensor compact(const Tensor& x) const;
  // y (M, C) kept rows and x (N, C) the input: (N, C) with y's rows in place
  // and x's rows where masked (differentiable in both).
  Tensor expand(const Tensor& y, const Tensor& x) const;
  // indices (M, Q) -> (N, Q) with -1 in masked rows.
  Tensor expand_indices(const Tensor& indices) const;

 private:
  int64_t rows_;
  Tensor keep_;  // (M) int64 row numbers, ascending; undefined without a mask
};

}  // namespace vqddp
