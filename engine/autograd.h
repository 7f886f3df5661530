// Autograd: a dynamic tape.
//
// Each differentiable op that sees an input requiring grad (and grad mode on)
// records a Node: the AutogradMeta of each input plus a backward closure that
// maps the output gradient to one gradient per input. The closure captures
// only what its formula needs, so graph nodes do not keep unrelated data
// alive. backward() walks the nodes in reverse topological order and
// accumulates into the .grad of leaf tensors.
//
// Grad mode is thread-local because ranks are threads: one rank running a
// no-grad validation pass must not switch off autograd on the others.
// Graphs are not shared between threads: each rank builds and walks its own
// (DDP gives every rank its own parameters), so nodes and .grad slots need
// no locks.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

struct Node;

struct AutogradMeta {
  bool requires_grad = false;
  // The same value on every rank: a parameter, a constant, or computed from
  // those alone (engine/exact_batch.h). Where a batched op meets it, its
  // gradient is a sum over the batch, taken by units in an exact step.
  bool batch_free = false;
  Tensor grad;                    // accumulated gradient (leaves only)
  std::shared_ptr<Node> grad_fn;  // op that produced the tensor; null for leaves
  int output_index = 0;           // which of grad_fn's outputs this is
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out)>;
// An op of several outputs: one gradient per output (undefined where none
// flowed into it) -> one per input.
using MultiBackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads_out)>;

struct Node {
  const char* name;  // op name, for error messages
  // One entry per op input; null where that input needs no gradient.
  std::vector<std::shared_ptr<AutogradMeta>> inputs;
  std::vector<Shape> input_shapes;  // checked against the returned gradients
  // Storage and version of each tensor the backward formula reads, checked
  // before it runs: an in-place write in between (an optimizer step, an EMA
  // codebook update, a collective) would otherwise give a silently wrong
  // gradient.
  std::vector<std::pair<std::shared_ptr<Storage>, uint64_t>> saved;
  BackwardFn backward;              // a one-output op's formula
  MultiBackwardFn multi_backward;  // or one of several outputs' (record_multi_op)
  int outputs = 1;
  bool batch_free = false;  // every input batch-free: the output is too

  // Releases the graph behind this node iteratively: a long chain (a
  // training loop that never calls backward) would otherwise be destroyed
  // recursively and overflow the stack.
  ~Node();
};

// Thread-local grad mode.
bool grad_enabled();
void set_grad_enabled(bool on);

// RAII: autograd records nothing in this thread while a guard lives.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Attaches a backward node to `out` when grad mode is on and any input
// requires grad; returns `out`. Ops call this once after their forward.
// `backward` must return one tensor per input (undefined where an input has
// no gradient), each with that input's shape.
// `saved` lists the tensors whose VALUES the backward reads (not those it
// only needs shapes of); their versions are checked before it runs.
Tensor record_op(const char* name, Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
                 BackwardFn backward);
Tensor record_op(const char* name, Tensor out, const std::vector<Tensor>& inputs, BackwardFn backward);
// The same for an op of several outputs (one node for all of them, whose
// backward runs once with every output's gradient): `outs` gain the node.
void record_multi_op(const char* name, std::vector<Tensor>& outs, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& saved, MultiBackwardFn backward);

// True when an op on these inputs would be recorded.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Inside a backward formula: true when input `i`'s gradient must be
// returned as unit partials [units, ...input shape] instead of a sum
// (backward() of an exact step, engine/exact_batch.h, at a batch-free input
// of a batched op). A formula that ignores it fails with a message naming
// the op, never silently.
bool wants_unit_partials(size_t i);

// Marks a tensor that is the same on every rank and is no parameter (a
// constant operand such as a scalar) as batch-free; returns it.
Tensor mark_batch_free(Tensor t);

// Makes a leaf INPUT require grad: batched (its rows are this rank's
// examples), so backward() gives it a gradient per row, where a leaf that
// requires grad is otherwise a parameter (batch-free, its gradient a sum
// over the batch). For input gradients (`vqddp replay`'s grad.x.N).
Tensor requires_input_grad(Tensor t);

}  // namespace vqddp
