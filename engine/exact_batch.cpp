#include "engine/exact_batch.h"

#include <numeric>

#include "engine/device_plans.h"
#include "engine/ops.h"

namespace vqddp {

namespace {
thread_local const ExactBatch* t_batch = nullptr;
}

int64_t ExactBatch::examples() const { return std::accumulate(unit_examples.begin(), unit_examples.end(), int64_t{0}); }

const ExactBatch* exact_batch() { return t_batch; }

ExactBatchScope::ExactBatchScope(ExactBatch batch) : batch_(std::move(batch)) {
  VQDDP_CHECK(t_batch == nullptr, "an exact step is already open on this thread (ExactBatchScope does not nest)");
  for (int64_t e : batch_.unit_examples) VQDDP_CHECK(e >= 1, "exact step: a unit holds {} examples (at least 1)", e);
  t_batch = &batch_;
}

ExactBatchScope::~ExactBatchScope() { t_batch = nullptr; }

std::vector<int64_t> unit_row_bounds(const Tensor& batched, const char* op) {
  const ExactBatch* b = exact_batch();
  VQDDP_ASSERT(b != nullptr, "{}: unit partials outside an exact step", op);
  VQDDP_CHECK(batched.dim() >= 1, "{}: a batched tensor {} has no batch dimension (exact data parallelism: a "
              "parameter met a batched scalar)", op, batched.desc());
  int64_t rows = batched.size(0), examples = b->examples();
  VQDDP_CHECK(examples > 0 ? rows % examples == 0 : rows == 0,
              "{}: batched tensor {} does not hold the same number of rows for each of this rank's {} examples "
              "(exact data parallelism needs dimension 0 example-major)", op, batched.desc(), examples);
  int64_t per = examples > 0 ? rows / examples : 0;
  std::vector<int64_t> bounds{0};
  for (int64_t e : b->unit_examples) bounds.push_back(bounds.back() + e * per);
  return bounds;
}

Tensor stack_units(const std::vector<Tensor>& parts, const Shape& shape, Device device) {
  int64_t numel = shape_numel(shape);
  Tensor out = empty({static_cast<int64_t>(parts.size()), numel}, DType::f32, device);
  for (size_t u = 0; u < parts.size(); ++u)
    out.slice_rows(static_cast<int64_t>(u), static_cast<int64_t>(u) + 1).copy_(parts[u].reshape({1, numel}));
  Shape stacked{static_cast<int64_t>(parts.size())};
  stacked.insert(stacked.end(), shape.begin(), shape.end());
  return out.reshape(stacked);
}

Tensor unit_sum_to_shape(const Tensor& g, const Shape& shape, const char* op) {
  std::vector<int64_t> bounds = unit_row_bounds(g, op);
  // The target must not keep the batch dimension: a batch-free input that
  // broadcasts over the rows, e.g. a bias [D] or [C, 1, 1].
  VQDDP_CHECK(shape.size() < static_cast<size_t>(g.dim()) || shape[0] == 1,
              "{}: a batch-free input of shape {} meets the batched {} along the batch dimension", op,
              shape_str(shape), g.desc());
  const int64_t units = static_cast<int64_t>(bounds.size()) - 1, unit_rows = units > 0 ? bounds[1] - bounds[0] : 0;
  bool equal = unit_rows > 0;
  for (int64_t u = 1; equal && u < units; ++u) equal = bounds[u + 1] - bounds[u] == unit_rows;
  Shape unit_shape = g.shape();
  unit_shape[0] = unit_rows;
  if (equal && unit_shape != shape) {
    // Units of equal rows (an exact step's examples): one reduction for all
    // of them, g viewed as [units, rows, ...] summed to [units, 1, ...shape].
    // Each output sums the same elements in the same order as one unit's
    // sum_to_shape (the order depends on the reduced dimensions alone,
    // device.h ReducePlan), so the same bits with one launch, not two per unit.
    Shape in{units};
    in.insert(in.end(), unit_shape.begin(), unit_shape.end());
    Shape out_shape{units};
    out_shape.resize(in.size() - shape.size(), 1);
    out_shape.insert(out_shape.end(), shape.begin(), shape.end());
    Tensor out = empty(out_shape, DType::f32, g.device());
    device_of(op, {&g}).reduce_sum(static_cast<const float*>(g.raw_ptr()), static_cast<float*>(out.raw_ptr()),
                                   sum_to_plan(in, out_shape, 1.0));
    Shape stacked{units};
    stacked.insert(stacked.end(), shape.begin(), shape.end());
    return out.reshape(stacked);
  }
  std::vector<Tensor> parts;
  for (size_t u = 0; u + 1 < bounds.size(); ++u) {
    Tensor rows = g.slice_rows(bounds[u], bounds[u + 1]);
    parts.push_back(rows.numel() == 0 ? zeros(shape, DType::f32, g.device()) : sum_to_shape(rows, shape));
  }
  return stack_units(parts, shape, g.device());
}

}  // namespace vqddp
