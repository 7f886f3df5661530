#include "engine/step_graph.h"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace vqddp {

namespace {

struct Launch {
  const char* kernel;
  uint64_t signature;
};

// Blocks of graphs destroyed while a tensor still held them: released to
// their table when that tensor lets go (graph_release).
std::mutex g_orphans_mu;
std::unordered_map<void*, int64_t> g_orphans;  // block -> holders
std::atomic<bool> g_any_orphans = false;        // set under g_orphans_mu; read first without it

}  // namespace

struct GraphSession {
  Device device;
  DeviceKernels* inner = nullptr;    // device_kernels(device): the counting table
  DeviceKernels* backend = nullptr;  // the table below it, where the arena's blocks come from
  bool native = false;             // the backend captures its stream (a GPU)
  bool in_step = false, capturing = false;
  bool has_capture = false;  // a step was captured (its launches may be none)
  std::string variant;  // noted in the step being captured
  std::string stopped;  // why graphing stopped
  int64_t step = 0, replays = 0;

  // The captured step: its launches, and on sim what each runs.
  std::vector<Launch> launches;
  std::vector<std::function<void()>> runs;
  void* graph = nullptr;  // the backend's graph (native)
  size_t next = 0;        // the launch a replay checks next

  // The arena: block i serves allocation i of every step.
  struct Block {
    void* p;
    size_t bytes;
    int64_t holders;
    size_t launches_before = 0;  // launches of the step when it was allocated
  };
  std::vector<Block> blocks;
  std::unordered_map<void*, size_t> block_of;
  // Memory a launch being captured allocates itself (nested > 0): the
  // graph's, outside the step's numbering (a replay skips that launch).
  int nested = 0;
  std::vector<Block> inner_blocks;
  std::unordered_map<void*, size_t> inner_block_of;
  size_t next_alloc = 0;
  // Uploads of the capture on a GPU, queued once it ends.
  std::vector<std::pair<void*, std::vector<unsigned char>>> held_uploads;
  // On sim, blocks from before the step freed while it is captured: the
  // recorded calls run at the step's end and may read them; freed then.
  std::vector<std::pair<void*, size_t>> freed_in_capture;

  // The arena's blocks go: those no tensor holds back to the backend, the
  // others when their last holder lets go (graph_release's orphans).
  void release_blocks() {
    blocks.insert(blocks.end(), inner_blocks.begin(), inner_blocks.end());
    for (Block& b : blocks) {
      if (b.holders > 0) {
        std::lock_guard<std::mutex> lock(g_orphans_mu);
        g_orphans[b.p] = b.holders;
        g_any_orphans = true;
      } else {
        backend->release(b.p, b.bytes);
      }
    }
    blocks.clear();
    block_of.clear();
    inner_blocks.clear();
    inner_block_of.clear();
  }

  size_t launched() const { return capturing ? launches.size() : next; }

  // The block of this step holding address p (a view's offset included),
  // or nullptr.
  const Block* block_at(const void* p) const {
    for (size_t i = 0; i < next_alloc; ++i) {
      auto* b = static_cast<const unsigned char*>(blocks[i].p);
      if (p >= b && p < b + blocks[i].bytes) return &blocks[i];
    }
    return nullptr;
  }
};

namespace {

thread_local GraphSession* t_graph = nullptr;

}  // namespace

StepGraph::StepGraph(Device device) : s_(std::make_unique<GraphSession>()) {
  VQDDP_CHECK(device.kind == Device::Kind::sim || device.kind == Device::Kind::cuda,
              "step graphs run on sim or cuda, not on {}", device.str());
  VQDDP_CHECK(t_graph == nullptr, "a thread has one step graph at a time");
  s_->device = device;
  s_->inner = &device_kernels(device);
  s_->native = s_->inner->captures_streams();
  t_graph = s_.get();
}

StepGraph::~StepGraph() {
  GraphSession& g = *s_;
  if (g.in_step) abandon_step();
  g.runs.clear();  // closures holding tensors release them into the arena
  try {
    if (g.graph) g.inner->destroy_graph(g.graph);
  } catch (const std::exception&) {  // a device already failing: nothing more to free there
  }
  t_graph = nullptr;
  if (g.backend) g.release_blocks();
}

void StepGraph::begin_step(int64_t step) {
  GraphSession& g = *s_;
  VQDDP_CHECK(!g.in_step, "step graph: step {} began inside step {}", step, g.step);
  g.in_step = true;
  g.step = step;
  g.next = 0;
  g.next_alloc = 0;
  g.capturing = !g.has_capture;
  g.variant.clear();
  if (!g.stopped.empty()) {
    g.in_step = false;  // eager from here on
    return;
  }
  if (g.capturing && g.native) g.inner->begin_capture();
}

void StepGraph::end_step() {
  GraphSession& g = *s_;
  if (!g.stopped.empty()) return;
  VQDDP_CHECK(g.in_step, "step graph: end_step without begin_step");
  if (g.capturing) {
    g.in_step = false;
    if (g.native) {
      try {
        g.graph = g.inner->end_capture();
      } catch (const std::exception& e) {
        g.launches.clear();
        VQDDP_THROW("step graph ({}): capturing step {} failed: {}; run.step_graphs false (train --step-graphs off) "
                    "issues every launch on its own", g.device.str(), g.step, e.what());
      }
      for (auto& [dst, bytes] : g.held_uploads) g.inner->copy(dst, false, bytes.data(), true, bytes.size());
      g.held_uploads.clear();
    }
    g.capturing = false;
    g.has_capture = true;
  } else {
    g.in_step = false;
    const size_t want = g.launches.size();
    VQDDP_CHECK(g.next == want, "step graph: step {} launched {} kernels, the captured step {}: a graphed step must "
                "launch what the captured one did", g.step, g.next, want);
    ++g.replays;
  }
  if (g.native) {
    g.inner->launch_graph(g.graph);
  } else {
    for (const std::function<void()>& run : g.runs) run();
    for (auto [p, bytes] : g.freed_in_capture) g.backend->release(p, bytes);
    g.freed_in_capture.clear();
  }
  if (!g.variant.empty()) {
    // The captured step ran once; later steps may launch another sequence.
    g.stopped = fmt::format("step {} chose its launches on the host ({})", g.step, g.variant);
    g.runs.clear();
    g.launches.clear();
    g.has_capture = false;
    if (g.graph) g.inner->destroy_graph(g.graph);
    g.graph = nullptr;
  }
}

const std::string& StepGraph::stopped_because() const { return s_->stopped; }

void graph_note_variant(const char* what) {
  if (GraphSession* g = t_graph; g && g->in_step && g->variant.empty()) g->variant = what;
}

void StepGraph::abandon_step() {
  GraphSession& g = *s_;
  if (!g.in_step) return;
  g.in_step = false;
  if (g.capturing) {
    if (g.native) {
      // Called with an error on its way (and from the destructor): the
      // stream leaves capture mode whatever the capture's state; a second
      // error here would only hide the first.
      try {
        void* graph = g.inner->end_capture();
        if (graph) g.inner->destroy_graph(graph);
      } catch (const std::exception&) {
      }
    }
    g.launches.clear();
    g.runs.clear();
    g.held_uploads.clear();
    for (auto [p, bytes] : g.freed_in_capture) g.backend->release(p, bytes);
    g.freed_in_capture.clear();
    g.capturing = false;
    // The next capture numbers its own blocks.
    if (g.backend) g.release_blocks();
  }
}

bool StepGraph::captured() const { return s_->has_capture; }
int64_t StepGraph::launches() const {
  return static_cast<int64_t>(s_->launches.size());
}
int64_t StepGraph::replays() const { return s_->replays; }

GraphSession* graph_in_step_of(const DeviceKernels* table) {
  GraphSession* g = t_graph;
  return g && g->in_step && g->inner == table ? g : nullptr;
}

void graph_launch(GraphSession& g, const char* kernel, uint64_t signature, std::function<void()> run) {
  if (g.nested > 0) {  // inside a launch being captured: part of it
    run();
    return;
  }
  if (g.capturing) {
    g.launches.push_back({kernel, signature});
    if (!g.native) {
      g.runs.push_back(std::move(run));
      return;
    }
    ++g.nested;  // the stream records what it queues
    try {
      run();
    } catch (...) {
      --g.nested;
      throw;
    }
    --g.nested;
    return;
  }
  const size_t i = g.next++;
  VQDDP_CHECK(i < g.launches.size() && g.launches[i].kernel == std::string(kernel) &&
                  g.launches[i].signature == signature,
              "step graph ({}): launch {} of step {} is {} {}, the captured step's was {}: a graphed step must "
              "launch the captured step's kernels on the same buffers with the same arguments (carry state in "
              "place, upload what changes; train --step-graphs off issues every launch on its own)", g.device.str(), i + 1, g.step, kernel,
              i < g.launches.size() && g.launches[i].kernel == std::string(kernel) ? "with other arguments" : "",
              i < g.launches.size() ? g.launches[i].kernel : "none (it launched fewer)");
}

void* graph_alloc(GraphSession& g, size_t bytes, DeviceKernels& backend) {
  if (bytes == 0) return nullptr;
  if (g.nested > 0) {
    g.backend = &backend;
    void* p = backend.alloc(bytes);
    g.inner_block_of[p] = g.inner_blocks.size();
    g.inner_blocks.push_back({p, bytes, 1});
    return p;
  }
  const size_t i = g.next_alloc++;
  if (i == g.blocks.size()) {
    VQDDP_CHECK(g.capturing, "step graph ({}): step {} allocated more than the captured step ({} blocks)",
                g.device.str(), g.step, g.blocks.size());
    g.backend = &backend;
    void* p = backend.alloc(bytes);
    g.blocks.push_back({p, bytes, 0});
    g.block_of[p] = i;
  }
  GraphSession::Block& b = g.blocks[i];
  VQDDP_CHECK(b.bytes == bytes, "step graph ({}): allocation {} of step {} is {} bytes, the captured step's was {}",
              g.device.str(), i + 1, g.step, bytes, b.bytes);
  ++b.holders;
  b.launches_before = g.launched();
  return b.p;
}

bool graph_release(const DeviceKernels* table, void* p, size_t bytes, DeviceKernels& backend) {
  if (GraphSession* g = t_graph; g && g->inner == table) {
    auto it = g->block_of.find(p);
    if (it != g->block_of.end()) {
      --g->blocks[it->second].holders;
      return true;
    }
    auto in = g->inner_block_of.find(p);
    if (in != g->inner_block_of.end()) {
      --g->inner_blocks[in->second].holders;
      return true;
    }
    if (g->in_step && g->capturing && !g->native) {
      g->backend = &backend;
      g->freed_in_capture.emplace_back(p, bytes);
      return true;
    }
  }
  if (!g_any_orphans) return false;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  auto it = g_orphans.find(p);
  if (it == g_orphans.end()) return false;
  if (--it->second == 0) {
    g_orphans.erase(it);
    g_any_orphans = !g_orphans.empty();
    return false;  // the last holder: the table frees it
  }
  return true;
}

void graph_upload(GraphSession& g, void* dst, const void* src, size_t bytes, DeviceKernels& backend) {
  // Uploads land before the replay's first launch, so only a buffer no
  // launch of the step can have used yet may take one: a block allocated
  // since the step's last launch (a tensor's to(): allocate, then copy).
  const GraphSession::Block* b = g.block_at(dst);
  VQDDP_CHECK(b, "step graph ({}): step {} uploads {} bytes into a buffer made before the step: a launch of the "
              "step before the upload would read the new contents in a replay; upload into a new tensor",
              g.device.str(), g.step, bytes);
  VQDDP_CHECK(b->launches_before == g.launched(), "step graph ({}): step {} uploads {} bytes into a tensor after "
              "launch {} of the step, which may have used it: the replay would upload before every launch; upload "
              "into a new tensor", g.device.str(), g.step, bytes, g.launched());
  if (g.capturing && g.native) {
    auto* b = static_cast<const unsigned char*>(src);
    g.held_uploads.emplace_back(dst, std::vector<unsigned char>(b, b + bytes));
    return;
  }
  backend.copy(dst, false, src, true, bytes);
}

void graph_refuse_read(GraphSession& g, const char* what) {
  VQDDP_THROW("step graph ({}): step {} {} inside the step: nothing of a graphed step has run before its end, so "
              "the host may not read the device or wait for it there", g.device.str(), g.step, what);
}

void add_to_signature(LaunchSignature& s, const Tensor& t) {
  s.add(t.defined());
  if (!t.defined()) return;
  s.add(t.raw_ptr());
  s.add(t.dtype());
  s.add(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) s.add(t.size(d));  // contiguous: the shape is the layout
}

}  // namespace vqddp
