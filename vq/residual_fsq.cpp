#include "vq/residual_fsq.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace vqddp {

ResidualFSQ::ResidualFSQ(const ResidualFSQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.num_quantizers >= 1, "ResidualFSQ: num_quantizers {} must be positive", o.num_quantizers);
  fsq_ = std::make_shared<FSQ>(FSQOptions{o.levels, 0, 1}, init_gen);
  code_dim_ = fsq_->code_dim();
  if (opt_.dim == 0) opt_.dim = code_dim_;
  if (opt_.dim != code_dim_) {
    project_in_ = register_module("project_in", std::make_shared<Linear>(opt_.dim, code_dim_, init_gen));
    project_out_ = register_module("project_out", std::make_shared<Linear>(code_dim_, opt_.dim, init_gen));
  }
  for (int i = 0; i < o.num_quantizers; ++i) {
    std::vector<float> s;
    for (int l : o.levels) s.push_back(static_cast<float>(std::pow(double(l), -double(i))));
    scales_.push_back(from_vector(s, {code_dim_}));
  }
  dropout_step_ = register_buffer("dropout_step", zeros({1}, DType::i64));
}

ResidualFSQOutput ResidualFSQ::forward(const Tensor& x) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim, "ResidualFSQ expects [N, {}], got {}", opt_.dim,
              x.desc());
  const int q = opt_.num_quantizers;
  Tensor z = project_in_ ? project_in_->forward(x) : x;  // (N, D)
  int64_t n = z.size(0);
  int last = last_active_layer(opt_.quantize_dropout, q, is_training() && grad_enabled(), opt_.seed, dropout_step_);
  Tensor residual = z, sum = zeros({n, code_dim_});
  std::vector<int64_t> idx(n * q, -1);
  for (int l = 0; l <= last; ++l) {
    Tensor scaled = div(residual, scales_[l]);
    Tensor code = fsq_->quantize(scaled);                // (N, D)
    Tensor layer_idx = fsq_->codes_to_indices(code);
    Tensor quantized = mul(code, scales_[l]);
    residual = sub(residual, quantized.detach());
    sum = add(sum, quantized);
    for (int64_t i = 0; i < n; ++i) idx[i * q + l] = layer_idx.data<int64_t>()[i];
  }
  Tensor y = project_out_ ? project_out_->forward(sum) : sum;
  return {y, from_vector(idx, {n, q}), last + 1};
}

Tensor ResidualFSQ::decode(const Tensor& indices) const {
  const int q = opt_.num_quantizers;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == q,
              "ResidualFSQ: expected int64 indices [N, {}], got {}", q, indices.desc());
  int64_t n = indices.size(0);
  Tensor sum = zeros({n, code_dim_});
  Tensor t = transpose(indices);  // (Q, N)
  for (int l = 0; l < q; ++l) {
    Tensor li = t.slice_rows(l, l + 1).reshape({n});
    std::vector<int64_t> rows, valid;
    for (int64_t i = 0; i < n; ++i)
      if (li.data<int64_t>()[i] >= 0) {
        rows.push_back(i);
        valid.push_back(li.data<int64_t>()[i]);
      }
    if (rows.empty()) continue;
    Tensor codes = mul(fsq_->indices_to_codes(from_vector(valid, {static_cast<int64_t>(valid.size())})), scales_[l]);
    Tensor full_codes = zeros({n, code_dim_});
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(codes.data<float>() + r * code_dim_, code_dim_, full_codes.data<float>() + rows[r] * code_dim_);
    sum = add(sum, full_codes);
  }
  return project_out_ ? project_out_->forward(sum) : sum;
}

}  // namespace vqddp
