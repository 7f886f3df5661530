#include "engine/autograd.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "engine/exact_batch.h"
#include "engine/op_profile.h"
#include "engine/ops.h"

namespace vqddp {

namespace {
thread_local bool t_grad_enabled = true;
// The node whose backward formula runs now in an exact step's first phase:
// which of its inputs want unit partials.
thread_local const std::vector<bool>* t_unit_inputs = nullptr;
// The node whose backward formula runs on this thread (for the op profile).
thread_local const char* t_backward_of = nullptr;

bool is_batch_free(const Tensor& t) { return t.impl()->autograd && t.impl()->autograd->batch_free; }
}  // namespace

bool wants_unit_partials(size_t i) { return t_unit_inputs && i < t_unit_inputs->size() && (*t_unit_inputs)[i]; }

Tensor mark_batch_free(Tensor t) {
  t.autograd_meta().batch_free = true;
  return t;
}

Tensor requires_input_grad(Tensor t) {
  t.set_requires_grad(true);
  t.autograd_meta().batch_free = false;
  return t;
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Node::~Node() {
  std::vector<std::shared_ptr<Node>> orphans;
  auto adopt = [&orphans](Node& n) {
    for (auto& in : n.inputs)
      if (in && in.use_count() == 1 && in->grad_fn && in->grad_fn.use_count() == 1)
        orphans.push_back(std::move(in->grad_fn));
    n.inputs.clear();
  };
  adopt(*this);
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    adopt(*n);  // n is destroyed at the end of this iteration with no inputs left
  }
}

Tensor record_op(const char* name, Tensor out, const std::vector<Tensor>& inputs, BackwardFn backward) {
  return record_op(name, std::move(out), inputs, {}, std::move(backward));
}

namespace {

std::shared_ptr<Node> make_node(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
                                int outputs) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->batch_free = true;
  node->outputs = outputs;
  for (const Tensor& t : inputs) {
    if (t.defined() && !is_batch_free(t)) node->batch_free = false;
    node->inputs.push_back(t.defined() && t.requires_grad() ? t.impl()->autograd : nullptr);
    node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
  }
  for (const Tensor& t : saved) node->saved.emplace_back(t.impl()->storage, t.version());
  return node;
}

void attach(Tensor& out, const std::shared_ptr<Node>& node, int index) {
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.batch_free = node->batch_free;
  meta.grad_fn = node;
  meta.output_index = index;
}

}  // namespace

Tensor record_op(const char* name, Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
                 BackwardFn backward) {
  // The op has just computed `out`; inside a backward formula it is
  // charged as part of that formula.
  if (op_profile_enabled()) op_profile_mark(t_backward_of ? fmt::format("{} backward: {}", t_backward_of, name) : name);
  if (!any_requires_grad(inputs)) return out;
  std::shared_ptr<Node> node = make_node(name, inputs, saved, 1);
  node->backward = std::move(backward);
  attach(out, node, 0);
  return out;
}

void record_multi_op(const char* name, std::vector<Tensor>& outs, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& saved, MultiBackwardFn backward) {
  if (op_profile_enabled()) op_profile_mark(t_backward_of ? fmt::format("{} backward: {}", t_backward_of, name) : name);
  if (!any_requires_grad(inputs)) return;
  std::shared_ptr<Node> node = make_node(name, inputs, saved, static_cast<int>(outs.size()));
  node->multi_backward = std::move(backward);
  for (size_t i = 0; i < outs.size(); ++i) attach(outs[i], node, static_cast<int>(i));
}

namespace {

// Nodes reachable from `root`, ordered so that every node comes before the
// nodes that produced its inputs. Iterative DFS: graphs of long training
// loops would overflow the stack recursively.
std::vector<Node*> reverse_topological_order(Node* root) {
  std::vector<Node*> post;
  std::unordered_set<Node*> seen{root};
  std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const auto& in = node->inputs[next++];
      Node* child = in ? in->grad_fn.get() : nullptr;
      if (child && seen.insert(child).second) stack.push_back({child, 0});
    } else {
      post.push_back(node);
      stack.pop_back();
    }
  }
  return {post.rbegin(), post.rend()};
}

void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined())
    slot = g.clone();
  else
    slot.copy_(add(slot, g));
}

// accumulate for a gradient the pass may give away: one no other handle or
// view can reach (its handle and storage held once, here) becomes the slot
// as it is, without the copy; any other is accumulated.
void accumulate_owned(Tensor& slot, Tensor& g) {
  if (!slot.defined() && g.impl().use_count() == 1 && g.impl()->storage.use_count() == 1)
    slot = std::move(g);
  else
    accumulate(slot, g);
}

// The same sum for a node's pending gradient, which nothing outside the
// pass holds: it may share g's storage (a backward that passes its input
// gradient on as it is, to one input or several) because it is never
// written in place, only replaced. Saves the copy of every first gradient.
void accumulate_pending(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }

}  // namespace

namespace {

// Runs `node`'s backward formula on its pending gradient and passes each
// input's gradient on: into the producing node's pending sum, a leaf's
// .grad, or (when `units` is given: an exact step's first phase) the unit
// partials of a batch-free input.
struct Boundary {
  std::shared_ptr<AutogradMeta> meta;
  Shape shape;
  Tensor partials;  // [units, ...shape]
};

// A node's pending gradients, one slot per output.
using Pending = std::unordered_map<Node*, std::vector<Tensor>>;

Tensor& pending_slot(Pending& pending, const AutogradMeta& meta) {
  std::vector<Tensor>& slots = pending[meta.grad_fn.get()];
  slots.resize(static_cast<size_t>(meta.grad_fn->outputs));
  return slots[static_cast<size_t>(meta.output_index)];
}

void run_node(Node* node, Pending& pending, std::vector<Boundary>* units) {
  auto it = pending.find(node);
  if (it == pending.end()) return;  // no gradient flows into this node
  std::vector<Tensor> grad_out = std::move(it->second);
  pending.erase(it);
  for (const auto& [storage, version] : node->saved)
    VQDDP_CHECK(storage->version.load(std::memory_order_relaxed) == version,
                "backward of '{}': a tensor it saved was modified in place after the forward (version {}, saved at "
                "{}); clone it before writing, or run backward first",
                node->name, storage->version.load(std::memory_order_relaxed), version);
  std::vector<bool> wants(node->inputs.size(), false);
  if (units)
    for (size_t i = 0; i < wants.size(); ++i) wants[i] = node->inputs[i] && node->inputs[i]->batch_free;
  t_unit_inputs = &wants;
  std::vector<Tensor> grads;
  try {
    op_profile_mark("(autograd between backward formulas)");
    t_backward_of = node->name;
    grads = node->multi_backward ? node->multi_backward(grad_out) : node->backward(grad_out[0]);
    grad_out.clear();  // a view of it in grads is then the gradient's only holder (accumulate_owned)
    t_backward_of = nullptr;
    if (op_profile_enabled()) op_profile_mark(std::string(node->name) + " backward");
  } catch (...) {
    t_backward_of = nullptr;
    t_unit_inputs = nullptr;
    throw;
  }
  t_unit_inputs = nullptr;
  VQDDP_ASSERT(grads.size() == node->inputs.size(), "backward of '{}' returned {} gradients for {} inputs", node->name,
              grads.size(), node->inputs.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& in = node->inputs[i];
    if (!in || !grads[i].defined()) continue;
    if (wants[i]) {
      Shape expected{static_cast<int64_t>(exact_batch()->unit_examples.size())};
      expected.insert(expected.end(), node->input_shapes[i].begin(), node->input_shapes[i].end());
      VQDDP_ASSERT(grads[i].shape() == expected,
                  "backward of '{}': input {} ({}) is batch-free and the op batched, so its gradient is a sum over "
                  "the batch that an exact step takes by units, as [{}]; got {} ('{}' does not support exact data "
                  "parallelism for this input)", node->name, i, shape_str(node->input_shapes[i]),
                  shape_str(expected), shape_str(grads[i].shape()), node->name);
      auto b = std::find_if(units->begin(), units->end(), [&](const Boundary& x) { return x.meta == in; });
      // The pass alone holds a boundary's partials and never writes them in
      // place: kept as the backward returned them (no copy), summed by
      // replacement like a pending gradient.
      if (b == units->end())
        units->push_back({in, node->input_shapes[i], grads[i]});
      else
        accumulate_pending(b->partials, grads[i]);
      continue;
    }
    VQDDP_ASSERT(grads[i].shape() == node->input_shapes[i], "backward of '{}': gradient {} has shape {}, input has {}",
                node->name, i, shape_str(grads[i].shape()), shape_str(node->input_shapes[i]));
    if (in->grad_fn)
      accumulate_pending(pending_slot(pending, *in), grads[i]);
    else
      accumulate_owned(in->grad, grads[i]);
  }
}

}  // namespace

void Tensor::backward() const {
  VQDDP_CHECK(defined(), "backward() on an undefined tensor");
  VQDDP_CHECK(numel() == 1, "backward() needs a one-element tensor, got {}", desc());
  VQDDP_CHECK(requires_grad(), "backward() on a tensor that does not require grad");
  NoGradGuard no_grad;  // the backward pass itself is not recorded
  AutogradMeta& root = autograd_meta();
  Tensor seed = ones(shape(), DType::f32, device());  // on the loss's device: a CPU seed fails the first device op
  const ExactBatch* exact = exact_batch();
  VQDDP_CHECK(!exact || exact->reduce, "backward() in an exact step that has no unit reducer");
  if (!root.grad_fn) {
    accumulate(root.grad, seed);
    return;
  }
  Pending pending;
  pending_slot(pending, root) = seed;
  std::vector<Node*> order = reverse_topological_order(root.grad_fn.get());
  if (!exact) {
    for (Node* node : order) run_node(node, pending, nullptr);
    return;
  }
  // Phase 1: the batched nodes; each batch-free input they reach collects
  // unit partials (in the order reached, which the graph alone decides, so
  // every rank lists the same boundaries in the same order).
  std::vector<Boundary> boundaries;
  for (Node* node : order)
    if (!node->batch_free) run_node(node, pending, &boundaries);
  // One reduction over the ranks for all of them: the global sums.
  std::vector<Tensor> partials;
  for (const Boundary& b : boundaries) partials.push_back(b.partials);
  std::vector<Tensor> sums = exact->reduce(partials);
  VQDDP_CHECK(sums.size() == boundaries.size(), "exact step: the reducer returned {} sums for {} partials",
              sums.size(), boundaries.size());
  for (size_t i = 0; i < sums.size(); ++i) {
    VQDDP_CHECK(sums[i].shape() == boundaries[i].shape, "exact step: reduced gradient {} has shape {}, expected {}", i,
                shape_str(sums[i].shape()), shape_str(boundaries[i].shape));
    AutogradMeta& in = *boundaries[i].meta;
    // The reducer's sums are new tensors no one else holds: a leaf without a
    // gradient takes its sum as its .grad (no copy); one with a gradient
    // adds it in place as ever.
    if (in.grad_fn)
      accumulate_pending(pending_slot(pending, in), sums[i]);
    else if (!in.grad.defined())
      in.grad = sums[i];
    else
      accumulate(in.grad, sums[i]);
  }
  // Phase 2: the batch-free graph (weight norm and the like) on the global
  // sums, the same on every rank.
  for (Node* node : order)
    if (node->batch_free) run_node(node, pending, nullptr);
}

}  // namespace vqddp
