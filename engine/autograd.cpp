#include "engine/autograd.h"

#include <unordered_map>
#include <unordered_set>

#include "engine/ops.h"

namespace vqddp {

namespace {
thread_local bool t_grad_enabled = true;
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

Tensor record_op(const char* name, Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
                 BackwardFn backward) {
  if (!any_requires_grad(inputs)) return out;
  auto node = std::make_shared<Node>();
  node->name = name;
  for (const Tensor& t : inputs) {
    node->inputs.push_back(t.defined() && t.requires_grad() ? t.impl()->autograd : nullptr);
    node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
  }
  for (const Tensor& t : saved) node->saved.emplace_back(t.impl()->storage, t.version());
  node->backward = std::move(backward);
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
  return out;
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

}  // namespace

void Tensor::backward() const {
  VQDDP_CHECK(defined(), "backward() on an undefined tensor");
  VQDDP_CHECK(numel() == 1, "backward() needs a one-element tensor, got {}", desc());
  VQDDP_CHECK(requires_grad(), "backward() on a tensor that does not require grad");
  NoGradGuard no_grad;  // the backward pass itself is not recorded
  AutogradMeta& root = autograd_meta();
  Tensor seed = ones(shape(), DType::f32, device());  // on the loss's device: a CPU seed fails the first device op
  if (!root.grad_fn) {
    accumulate(root.grad, seed);
    return;
  }
  std::unordered_map<Node*, Tensor> pending{{root.grad_fn.get(), seed}};
  for (Node* node : reverse_topological_order(root.grad_fn.get())) {
    auto it = pending.find(node);
    if (it == pending.end()) continue;  // no gradient flows into this node
    Tensor grad_out = std::move(it->second);
    pending.erase(it);
    for (const auto& [storage, version] : node->saved)
      VQDDP_CHECK(storage->version.load(std::memory_order_relaxed) == version,
                  "backward of '{}': a tensor it saved was modified in place after the forward (version {}, saved at "
                  "{}); clone it before writing, or run backward first",
                  node->name, storage->version.load(std::memory_order_relaxed), version);
    std::vector<Tensor> grads = node->backward(grad_out);
    VQDDP_CHECK(grads.size() == node->inputs.size(), "backward of '{}' returned {} gradients for {} inputs",
                node->name, grads.size(), node->inputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto& in = node->inputs[i];
      if (!in || !grads[i].defined()) continue;
      VQDDP_CHECK(grads[i].shape() == node->input_shapes[i], "backward of '{}': gradient {} has shape {}, input has {}",
                  node->name, i, shape_str(grads[i].shape()), shape_str(node->input_shapes[i]));
      if (in->grad_fn)
        accumulate(pending[in->grad_fn.get()], grads[i]);
      else
        accumulate(in->grad, grads[i]);
    }
  }
}

}  // namespace vqddp
