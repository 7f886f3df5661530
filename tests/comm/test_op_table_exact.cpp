// The op table (tests/engine/op_table.h) inside an exact step
// (engine/exact_batch.h): every case's gradients on 1 thread rank equal the
// same loss's gradients outside an exact step (within rounding: the exact
// step rounds each unit's sum, then their sum), and on 2 and 3 thread ranks,
// uneven splits and a rank without examples included, they are bit for bit
// the 1-rank exact step's: every parameter's gradient on every rank, every
// batched input's gradient row by row.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "comm/batch_reduce.h"
#include "comm/thread_group.h"
#include "engine/autograd.h"
#include "tests/engine/op_table.h"
#include "tests/engine/same_bits.h"

using namespace vqddp;
using namespace vqddp::test;

// A named namespace, not an anonymous one: the sanitized builds are unity
// builds, where this file's helpers meet the other comm tests' in one unit.
namespace op_table_exact {

constexpr ThreadGroupOptions kRanksTimeout{.timeout = std::chrono::milliseconds(3000)};
constexpr int64_t kTile = 3;  // each batched input holds this many times the table's examples

// A case's global batch: its inputs with the batched ones tiled along
// dimension 0, how many examples they hold, and the loss weights.
struct Batch {
  std::vector<Tensor> inputs;
  int64_t examples = 0;
  Tensor per_example;  // [examples, 1]: weights a batch-free output per example (no batched input)
};

bool is_batched(const OpCase& c, size_t k) {
  return std::find(c.step.batched.begin(), c.step.batched.end(), k) != c.step.batched.end();
}

Batch global_batch(const OpCase& c) {
  std::vector<Tensor> table = make_inputs(c);
  Batch b;
  uint64_t tile_seed = 7;
  for (size_t k = 0; k < table.size(); ++k) {
    Tensor t = table[k].detach();
    if (is_batched(c, k)) {
      // The table's values first, then others of the same kind: fixed
      // inputs (kinks avoided, indices in range) repeat, drawn ones are drawn.
      std::vector<Tensor> parts{t};
      for (int64_t r = 1; r < kTile; ++r) {
        const Input& in = c.inputs[k];
        Generator gen(++tile_seed, k);
        parts.push_back(in.fixed.defined() ? t : rand_uniform(t.shape(), gen, in.low, in.high));
      }
      t = concat(parts, 0);
      if (b.examples == 0) b.examples = table[k].size(0) * kTile / c.step.rows_per_example;
    }
    b.inputs.push_back(c.inputs[k].requires_grad ? t.set_requires_grad(true) : t);
  }
  if (b.examples == 0) b.examples = 6;
  Generator gen(99, 0);
  b.per_example = rand_uniform({b.examples, 1}, gen, 0.5f, 1.5f);
  return b;
}

// Examples [lo, hi) of the global batch on this rank: batched inputs cut to
// their rows (as batched leaves), parameters whole (as parameters).
std::vector<Tensor> shard(const OpCase& c, const Batch& b, int64_t lo, int64_t hi) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < b.inputs.size(); ++k) {
    const Tensor& t = b.inputs[k];
    if (is_batched(c, k)) {
      int64_t rows = t.size(0) / b.examples;
      Tensor s = t.detach().slice_rows(lo * rows, hi * rows).clone();
      out.push_back(t.requires_grad() ? requires_input_grad(s) : s);
    } else {
      Tensor p = t.detach().clone();
      out.push_back(t.requires_grad() ? p.set_requires_grad(true) : mark_batch_free(p));
    }
  }
  return out;
}

// The loss of examples [lo, hi): sum(w * y) over this rank's rows of y
// (per-example output), over the whole y (already a sum over the rank's
// examples), or, without a batched input, sum(w * per_example * y).
Tensor loss_of(const OpCase& c, const Batch& b, const std::vector<Tensor>& inputs, int64_t lo, int64_t hi,
               Shape& y_shape) {
  Tensor y = c.f(inputs);
  Generator gen(4321, 0);
  if (c.step.batched.empty()) {
    Tensor rows = mul(b.per_example.slice_rows(lo, hi), reshape(y, {1, -1}));
    Tensor w = rand_uniform({b.examples, y.numel()}, gen, 0.5f, 1.5f);
    return sum(mul(rows, w.slice_rows(lo, hi)));
  }
  if (!c.step.per_example_output) return sum(mul(y, rand_uniform(y.shape(), gen, 0.5f, 1.5f)));
  // The global output's shape: this rank's rows per example times all examples.
  if (y_shape.empty()) {
    REQUIRE(hi > lo);
    y_shape = y.shape();
    y_shape[0] = y.size(0) / (hi - lo) * b.examples;
  }
  int64_t per = y_shape[0] / b.examples;
  return sum(mul(y, rand_uniform(y_shape, gen, 0.5f, 1.5f).slice_rows(lo * per, hi * per)));
}

// Every input's gradient (undefined where it takes none).
std::vector<Tensor> grads_of(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> g;
  for (const Tensor& x : inputs) g.push_back(x.requires_grad() ? x.grad() : Tensor());
  return g;
}

// Units of 1 and 2 examples in turn, covering the batch.
std::vector<int64_t> unit_sizes(int64_t examples) {
  std::vector<int64_t> u;
  for (int64_t left = examples, k = 0; left > 0; ++k) {
    u.push_back(std::min<int64_t>(left, 1 + k % 2));
    left -= u.back();
  }
  return u;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector<float>()) m = std::max(m, double(std::fabs(v)));
  return m;
}

// Within the rounding of the exact step's two-level sums and of a float
// GEMM of K <= 32 (the non-exact backward's BLAS).
bool close(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  const double tol = 1.6e-5 * std::max(1.0, max_abs(b));
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::fabs(double(x[i]) - double(y[i])) <= tol)) return false;
  return true;
}

// One exact step of this case on `comm`, the global batch split into
// `units` and those dealt to the ranks by `rank_units`: the gradients
// this rank holds.
std::vector<Tensor> exact_step(const OpCase& c, const Batch& b, Communicator& comm, const std::vector<int64_t>& units,
                               const std::vector<int64_t>& rank_units, Shape& y_shape) {
  int64_t first = 0;
  for (int r = 0; r < comm.rank(); ++r) first += rank_units[r];
  std::vector<int64_t> mine(units.begin() + first, units.begin() + first + rank_units[comm.rank()]);
  int64_t lo = 0, n = 0;
  for (int64_t u = 0; u < first; ++u) lo += units[u];
  for (int64_t e : mine) n += e;
  std::vector<Tensor> inputs = shard(c, b, lo, lo + n);
  ExactBatchScope exact(exact_batch_for(comm, mine, rank_units));
  loss_of(c, b, inputs, lo, lo + n, y_shape).backward();
  return grads_of(inputs);
}

TEST_CASE("op table in an exact step: every case's gradients equal the non-exact ones on 1 rank and are bit for bit "
          "the same on 2 and 3 ranks, uneven splits and an empty rank included") {
  std::vector<OpCase> table = op_table();
  int per_example = 0, contracted = 0, parameters_only = 0, splits_run = 0;
  for (const OpCase& c : table) {
    CAPTURE(c.name);
    (c.step.batched.empty() ? parameters_only : c.step.per_example_output ? per_example : contracted) += 1;
    Batch b = global_batch(c);
    Shape y_shape;
    // Outside an exact step: the whole batch on one rank.
    std::vector<Tensor> whole = shard(c, b, 0, b.examples);
    loss_of(c, b, whole, 0, b.examples, y_shape).backward();
    std::vector<Tensor> reference = grads_of(whole);

    const std::vector<int64_t> units = unit_sizes(b.examples);
    const int64_t u = static_cast<int64_t>(units.size());
    REQUIRE(u >= 3);
    std::vector<Tensor> one;
    run_ranks(1, [&](Communicator& comm) { one = exact_step(c, b, comm, units, {u}, y_shape); }, kRanksTimeout);
    for (size_t k = 0; k < one.size(); ++k) {
      if (!reference[k].defined()) continue;
      CAPTURE(k);
      REQUIRE(one[k].defined());
      CHECK(close(one[k], reference[k]));
    }
    for (std::vector<int64_t> split : {std::vector<int64_t>{1, u - 1}, {0, u - 1, 1}, {1, 1, u - 2}}) {
      const int world = static_cast<int>(split.size());
      std::vector<std::vector<Tensor>> got(world);
      run_ranks(world, [&](Communicator& comm) { got[comm.rank()] = exact_step(c, b, comm, units, split, y_shape); },
                kRanksTimeout);
      ++splits_run;
      for (size_t k = 0; k < one.size(); ++k) {
        if (!one[k].defined()) continue;
        CAPTURE(k);
        CAPTURE(split);
        if (is_batched(c, k)) {
          std::vector<Tensor> rows;
          for (const auto& g : got)
            if (g[k].defined() && g[k].size(0) > 0) rows.push_back(g[k]);
          CHECK(same_bits(concat(rows, 0), one[k]));
        } else {
          for (int r = 0; r < world; ++r) CHECK(same_bits(got[r][k], one[k]));
        }
      }
    }
  }
  MESSAGE("op table in an exact step: ", table.size(), " cases (", per_example, " per-example outputs, ", contracted,
          " summed over the examples, ", parameters_only, " on parameters alone), ", splits_run, " splits");
  CHECK(per_example > 40);
  CHECK(contracted >= 4);
}

}  // namespace op_table_exact
