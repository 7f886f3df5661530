#include "comm/batch_reduce.h"

#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

Shape without_rows(const Shape& s) { return Shape(s.begin() + 1, s.end()); }

// g repeated for every row of a tensor of `shape` [M, ...].
Tensor to_every_row(const Tensor& g, const Shape& shape) {
  Shape one{1};
  one.insert(one.end(), shape.begin() + 1, shape.end());
  return add(zeros(shape, DType::f32, g.device()), reshape(g, one));
}

}  // namespace

Tensor batch_sum(const Tensor& x, Communicator& comm) {
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() >= 1,
              "rank {}: batch_sum needs float32 rows [M, ...], got {}", comm.rank(), x.defined() ? x.desc() : "none");
  const ExactBatch* exact = exact_batch();
  Shape rest = without_rows(x.shape()), in_shape = x.shape();
  int64_t n = shape_numel(rest);
  Tensor out = empty({n}, DType::f32, x.device());
  if (exact) {
    Shape one{1};
    one.insert(one.end(), rest.begin(), rest.end());
    Tensor partials = unit_sum_to_shape(x.detach(), one, "batch_sum");
    comm.reduce_units(partials.reshape({partials.size(0), n}), exact->rank_units, out);
  } else {
    out.copy_(reshape(sum(x.detach(), 0), {n}));
    comm.all_reduce(out, ReduceOp::sum);
  }
  Communicator* c = &comm;
  return record_op("batch_sum", out.reshape(rest), {x}, [c, in_shape, exact = exact != nullptr](const Tensor& g) {
    Tensor global = g;
    if (!exact) {
      global = g.clone();
      c->all_reduce(global, ReduceOp::sum);
    }
    return std::vector<Tensor>{to_every_row(global, in_shape)};
  });
}

Tensor batch_mean(const Tensor& x, Communicator& comm) { return batch_means({x}, comm)[0]; }

std::vector<Tensor> batch_means(const std::vector<Tensor>& xs, Communicator& comm) {
  for (const Tensor& x : xs)
    VQDDP_CHECK(x.defined() && x.dtype() == DType::f32, "rank {}: batch_mean needs a float32 tensor", comm.rank());
  const ExactBatch* exact = exact_batch();
  std::vector<Tensor> out;
  if (!exact) {
    for (const Tensor& x : xs) out.push_back(x.numel() == 0 ? mul(sum(x), 0.f) : mean(x));
    return out;
  }
  if (xs.empty()) return out;
  // Per unit: (sum of its elements, their count) for each x, added over
  // the global batch in unit order, column by column; the count stays
  // exact in float32 up to 2^24. (The counts are sums of ones on the
  // device: no transfer.)
  std::vector<Tensor> columns;
  for (const Tensor& x : xs) {
    Tensor sums = unit_sum_to_shape(x.detach(), {}, "batch_mean");
    Tensor counts = unit_sum_to_shape(full(x.shape(), 1.0, DType::f32, x.device()), {}, "batch_mean");
    columns.push_back(reshape(sums, {sums.size(0), 1}));
    columns.push_back(reshape(counts, {counts.size(0), 1}));
  }
  const int64_t k = static_cast<int64_t>(xs.size());
  Tensor global = empty({2 * k}, DType::f32, xs[0].device());
  comm.reduce_units(columns, exact->rank_units, global);
  for (int64_t i = 0; i < k; ++i) {
    // A count of at least 1: an empty global batch's mean is 0 / 1 = 0.
    Tensor count = clamp(slice_rows(global, 2 * i + 1, 2 * i + 2), 1.f, 3.4e38f);
    Tensor value = reshape(div(slice_rows(global, 2 * i, 2 * i + 1), count), {});
    Shape shape = xs[i].shape();
    out.push_back(record_op("batch_mean", value, {xs[i]}, {count}, [count, shape](const Tensor& g) {
      // g / count in every element: one broadcast division, the bits of the
      // division copied out.
      Tensor grad = empty(shape, DType::f32, g.device());
      device_of("batch_mean backward", {&g, &count})
          .binary(BinaryOp::div, static_cast<const float*>(g.raw_ptr()), static_cast<const float*>(count.raw_ptr()),
                  static_cast<float*>(grad.raw_ptr()), broadcast_plan({1}, {1}, shape));
      return std::vector<Tensor>{grad};
    }));
  }
  return out;
}

std::vector<Tensor> reduce_unit_partials(Communicator& comm, const std::vector<Tensor>& partials,
                                         const std::vector<int64_t>& rank_units) {
  if (partials.empty()) return {};
  int64_t units = partials[0].size(0), total = 0;
  for (const Tensor& p : partials) {
    VQDDP_CHECK(p.dim() >= 1 && p.size(0) == units, "rank {}: unit partials {} do not have {} units", comm.rank(),
                p.desc(), units);
    total += shape_numel(without_rows(p.shape()));
  }
  // Every tensor's partials as a column block of one reduce_units: one
  // collective for the whole step, packed only where a transport needs it.
  Device device = partials[0].device();
  std::vector<Tensor> columns;
  for (const Tensor& p : partials) columns.push_back(p.reshape({units, shape_numel(without_rows(p.shape()))}));
  Tensor sums = empty({total}, DType::f32, device);
  comm.reduce_units(columns, rank_units, sums);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const Tensor& p : partials) {
    Shape shape = without_rows(p.shape());
    int64_t n = shape_numel(shape);
    out.push_back(sums.slice_rows(at, at + n).reshape(shape));
    at += n;
  }
  return out;
}

ExactBatch exact_batch_for(Communicator& comm, std::vector<int64_t> unit_examples, std::vector<int64_t> rank_units) {
  VQDDP_CHECK(static_cast<int>(rank_units.size()) == comm.world_size() &&
                  rank_units[comm.rank()] == static_cast<int64_t>(unit_examples.size()),
              "rank {}: an exact step of {} units, but the ranks' unit counts are {}", comm.rank(),
              unit_examples.size(), rank_units.size());
  ExactBatch b;
  b.unit_examples = std::move(unit_examples);
  b.rank_units = rank_units;
  Communicator* c = &comm;
  b.reduce = [c, rank_units](const std::vector<Tensor>& partials) {
    return reduce_unit_partials(*c, partials, rank_units);
  };
  return b;
}

}  // namespace vqddp
