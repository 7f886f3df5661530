#include "engine/step_graph.h"

#include <atomic>
#include <map>
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

// The launches between two host choices of a step (note_step_variant), or
// of a whole step without any: captured once per key, the choices made
// before it ("" for a step's first segment; "gan=2;" after a GAN step's
// choice), so a step is the sequence of its segments' graphs.
struct Segment {
  int64_t made = 0;  // steps that reached it
  bool has_capture = false;
  // The captured launches, and on sim what each runs.
  std::vector<Launch> launches;
  std::vector<std::function<void()>> runs;
  void* graph = nullptr;  // the backend's graph (native)

  // The arena: block i serves allocation i of the segment in every step.
  struct Block {
    void* p;
    size_t bytes;
    int64_t holders;
    size_t launches_before = 0;  // launches of the step when it was allocated
  };
  std::vector<Block> blocks;
  // Memory a launch being captured allocates itself: the graph's, outside
  // the numbering (a replay skips that launch).
  std::vector<Block> inner_blocks;
  // The row counts of its capture (graph_recall_counts): this rank's, and
  // every rank's; and those gathered in its issued first run, from its
  // start to the step's end, which its capture recalls.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> counts, issued_counts;
};

struct GraphSession {
  Device device;
  DeviceKernels* inner = nullptr;    // device_kernels(device): the counting table
  DeviceKernels* backend = nullptr;  // the table below it, where the arena's blocks come from
  bool native = false;             // the backend captures its stream (a GPU)
  bool in_step = false;
  std::string stopped;  // why graphing stopped
  int64_t step = 0, replays = 0;
  std::map<std::string, Segment> segments;

  // This step: its segments so far, the one running (being captured, or
  // checked against its capture), and whether any was captured.
  std::vector<Segment*> path;
  Segment* seg = nullptr;
  std::string key;
  bool capturing = false, captured_in_step = false;
  // The rest of the step runs as issued: a choice made for the first time
  // (its segment may do first-time work: a part's first optimizer step).
  bool eager = false;
  int64_t last_launches = 0;  // graphed launches of the last step
  size_t next = 0;            // the launch a replay checks next, in seg
  size_t next_alloc = 0;      // the allocation next, in seg
  size_t next_counts = 0;     // the row counts a replay recalls next, in seg
  size_t launches_before = 0;  // launches of the step's earlier segments
  int nested = 0;             // inside a launch being captured (> 0)
  bool gathering = false;     // in graph_recall_counts' own gather
  // Row counts (graph_recall_counts) of the last issued step
  // (begin_issued_step); once one ran, every capture recalls the counts of
  // its issued run (that step, or a choice's first run) instead of
  // gathering: `carry`, while a segment is captured. `recording`: where an
  // issued run's counts go.
  using Counts = std::vector<std::pair<int64_t, std::vector<int64_t>>>;
  Counts issued_counts;
  bool carried = false;
  bool issued = false;  // the step running is an issued one
  const Counts* carry = nullptr;
  Counts* recording = nullptr;
  // Every block of every segment: where a release finds it.
  std::unordered_map<void*, std::pair<Segment*, size_t>> block_of, inner_block_of;
  // Uploads of a capture on a GPU, queued once it ends.
  std::vector<std::pair<void*, std::vector<unsigned char>>> held_uploads;
  // On sim, blocks from before the step freed while it is captured: the
  // recorded calls run at the step's end and may read them; freed then.
  std::vector<std::pair<void*, size_t>> freed_in_capture;

  size_t launched() const { return launches_before + (capturing ? seg->launches.size() : next); }

  // A segment's blocks go: those no tensor holds back to the backend, the
  // others when their last holder lets go (graph_release's orphans).
  void release_blocks(Segment& s) {
    for (std::vector<Segment::Block>* list : {&s.blocks, &s.inner_blocks}) {
      for (Segment::Block& b : *list) {
        block_of.erase(b.p);
        inner_block_of.erase(b.p);
        if (b.holders > 0) {
          std::lock_guard<std::mutex> lock(g_orphans_mu);
          g_orphans[b.p] = b.holders;
          g_any_orphans = true;
        } else {
          backend->release(b.p, b.bytes);
        }
      }
      list->clear();
    }
  }

  // The block of this step holding address p (a view's offset included),
  // or nullptr.
  const Segment::Block* block_at(const void* p) const {
    for (const Segment* s : path) {
      const size_t made = s == seg ? next_alloc : s->blocks.size();
      for (size_t i = 0; i < made; ++i) {
        auto* b = static_cast<const unsigned char*>(s->blocks[i].p);
        if (p >= b && p < b + s->blocks[i].bytes) return &s->blocks[i];
      }
    }
    return nullptr;
  }

  // The segment of `k` starts: captured if it is new, else checked. A
  // choice's segment (k not "") is issued the first time it is made and
  // captured the second: its first run may do first-time work (the
  // trainer's whole steps warm up before graphing starts).
  void start_segment(const std::string& k) {
    key = k;
    seg = &segments[k];
    ++seg->made;
    if (!seg->has_capture && !k.empty() && seg->made == 1) {
      run_path();
      eager = true;
      seg->issued_counts.clear();
      recording = &seg->issued_counts;
      return;
    }
    path.push_back(seg);
    next = 0;
    next_alloc = 0;
    next_counts = 0;
    capturing = !seg->has_capture;
    carry = capturing && carried ? (k.empty() ? &issued_counts : &seg->issued_counts) : nullptr;
    if (capturing && native) inner->begin_capture();
  }

  // The step's segments so far run (their graphs launched, or on sim their
  // recorded calls), in order.
  void run_path() {
    last_launches = 0;
    for (Segment* s : path) {
      last_launches += static_cast<int64_t>(s->launches.size());
      if (native) {
        inner->launch_graph(s->graph);
      } else {
        for (const std::function<void()>& run : s->runs) run();
      }
    }
    path.clear();
    for (auto [p, bytes] : freed_in_capture) backend->release(p, bytes);
    freed_in_capture.clear();
  }

  // The running segment ends: its capture is kept, or its replay was whole.
  void finish_segment() {
    if (capturing) {
      if (native) {
        try {
          seg->graph = inner->end_capture();
        } catch (const std::exception& e) {
          seg->launches.clear();
          VQDDP_THROW("step graph ({}): capturing step {} failed: {}; run.step_graphs false (train --step-graphs "
                      "off) issues every launch on its own", device.str(), step, e.what());
        }
        for (auto& [dst, bytes] : held_uploads) inner->copy(dst, false, bytes.data(), true, bytes.size());
        held_uploads.clear();
      }
      capturing = false;
      seg->has_capture = true;
      captured_in_step = true;
    } else {
      const size_t want = seg->launches.size();
      VQDDP_CHECK(next == want, "step graph: step {} launched {} kernels{}, the captured step {}: a graphed step must "
                  "launch what the captured one did", step, next,
                  key.empty() ? std::string() : fmt::format(" after its choices ({})", key), want);
      VQDDP_CHECK(next_counts == seg->counts.size(), "step graph: step {} gathered row counts {} times{}, the "
                  "captured step {}: a graphed step must do what the captured one did", step, next_counts,
                  key.empty() ? std::string() : fmt::format(" after its choices ({})", key), seg->counts.size());
    }
    launches_before += seg->launches.size();
  }
};

namespace {

thread_local GraphSession* t_graph = nullptr;

}  // namespace

// More keys than this (a quantize dropout over many layers times a GAN's
// three steps) and graphing stops: each key holds a graph and its memory.
constexpr size_t kMaxSegments = 64;

StepGraph::StepGraph(Device device) : s_(std::make_unique<GraphSession>()) {
  VQDDP_CHECK(device.kind == Device::Kind::sim || device.kind == Device::Kind::cuda,
              "step graphs run on sim or cuda, not on {}", device.str());
  VQDDP_CHECK(t_graph == nullptr, "a thread has one step graph at a time");
  s_->device = device;
  s_->inner = &device_kernels(device);
  s_->native = s_->inner->captures_streams();
  t_graph = s_.get();
}

namespace {

// Every segment's graph and blocks go (the graph's end, or graphing's).
// While this thread's graph is still t_graph: the recorded closures hold
// tensors, which release into the arena (any segment's) first.
void drop_segments(GraphSession& g) {
  for (auto& [key, seg] : g.segments) {
    seg.runs.clear();
    try {
      if (seg.graph) g.inner->destroy_graph(seg.graph);
    } catch (const std::exception&) {  // a device already failing: nothing more to free there
    }
    seg.graph = nullptr;
  }
  if (g.backend)
    for (auto& [key, seg] : g.segments) g.release_blocks(seg);
  g.segments.clear();
}

}  // namespace

StepGraph::~StepGraph() {
  GraphSession& g = *s_;
  if (g.in_step) abandon_step();
  drop_segments(g);
  t_graph = nullptr;
}

void StepGraph::begin_step(int64_t step) {
  GraphSession& g = *s_;
  VQDDP_CHECK(!g.in_step, "step graph: step {} began inside step {}", step, g.step);
  if (!g.stopped.empty()) return;  // eager from here on
  g.in_step = true;
  g.step = step;
  g.path.clear();
  g.launches_before = 0;
  g.captured_in_step = false;
  g.eager = false;
  g.recording = nullptr;
  g.start_segment("");
}

void StepGraph::begin_issued_step(int64_t step) {
  GraphSession& g = *s_;
  VQDDP_CHECK(!g.in_step, "step graph: step {} began inside step {}", step, g.step);
  if (!g.stopped.empty()) return;
  g.in_step = true;
  g.step = step;
  g.path.clear();
  g.eager = true;  // issued as it goes: launches, reads and host collectives as outside a graph
  g.issued = true;
  g.carried = true;
  g.issued_counts.clear();
  g.recording = &g.issued_counts;
}

void StepGraph::end_step() {
  GraphSession& g = *s_;
  if (!g.stopped.empty()) return;
  VQDDP_CHECK(g.in_step, "step graph: end_step without begin_step");
  g.in_step = false;
  g.issued = false;
  if (g.eager) {  // its segments ran when it turned eager
    g.eager = false;
  } else {
    g.finish_segment();
    if (!g.captured_in_step) ++g.replays;
    g.run_path();
  }
  if (g.segments.size() > kMaxSegments) {
    g.stopped = fmt::format("step {} made the {}th choice of launches on the host ({}): more than {} graphs",
                            g.step, g.segments.size(), g.key, kMaxSegments);
    drop_segments(g);
  }
}

const std::string& StepGraph::stopped_because() const { return s_->stopped; }

void note_step_variant(const char* what, int64_t value) {
  GraphSession* g = t_graph;
  if (!g || !g->in_step || g->eager || g->nested > 0) return;
  g->finish_segment();
  g->start_segment(fmt::format("{}{}={};", g->key, what, value));
}

void StepGraph::abandon_step() {
  GraphSession& g = *s_;
  if (!g.in_step) return;
  g.in_step = false;
  g.eager = false;
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
    // The segment being captured is dropped (the next capture numbers its
    // own blocks); segments captured whole before it are kept.
    g.seg->launches.clear();
    g.seg->runs.clear();
    g.held_uploads.clear();
    g.capturing = false;
    if (g.backend) g.release_blocks(*g.seg);
    g.segments.erase(g.key);
  } else if (g.issued) {
    // Its row counts, half recorded, are no step's: captures gather again.
    g.carried = false;
    g.issued_counts.clear();
  } else if (g.seg && !g.key.empty() && !g.seg->has_capture) {
    // A choice's first run (issued), abandoned: its row counts are half
    // recorded, and its first-time work may not have run; it is made for
    // the first time again.
    if (g.backend) g.release_blocks(*g.seg);
    g.segments.erase(g.key);
  }
  g.issued = false;
  for (auto [p, bytes] : g.freed_in_capture) g.backend->release(p, bytes);
  g.freed_in_capture.clear();
  g.path.clear();
  g.seg = nullptr;
  g.key.clear();
}

bool StepGraph::captured() const {
  auto it = s_->segments.find("");
  return it != s_->segments.end() && it->second.has_capture;
}
int64_t StepGraph::launches() const { return s_->last_launches; }
int64_t StepGraph::replays() const { return s_->replays; }
int64_t StepGraph::graphs() const {
  int64_t n = 0;
  for (const auto& [key, seg] : s_->segments) n += seg.has_capture;
  return n;
}

GraphSession* graph_in_step_of(const DeviceKernels* table) {
  GraphSession* g = t_graph;
  return g && g->in_step && !g->eager && g->inner == table ? g : nullptr;
}

void graph_launch(GraphSession& g, const char* kernel, uint64_t signature, std::function<void()> run) {
  if (g.nested > 0) {  // inside a launch being captured: part of it
    run();
    return;
  }
  Segment& seg = *g.seg;
  if (g.capturing) {
    seg.launches.push_back({kernel, signature});
    if (!g.native) {
      seg.runs.push_back(std::move(run));
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
  VQDDP_CHECK(i < seg.launches.size() && seg.launches[i].kernel == std::string(kernel) &&
                  seg.launches[i].signature == signature,
              "step graph ({}): launch {} of step {} is {} {}, the captured step's was {}: a graphed step must "
              "launch the captured step's kernels on the same buffers with the same arguments (carry state in "
              "place, upload what changes; train --step-graphs off issues every launch on its own)", g.device.str(),
              g.launches_before + i + 1, g.step, kernel,
              i < seg.launches.size() && seg.launches[i].kernel == std::string(kernel) ? "with other arguments" : "",
              i < seg.launches.size() ? seg.launches[i].kernel : "none (it launched fewer)");
}

void* graph_alloc(GraphSession& g, size_t bytes, DeviceKernels& backend) {
  if (bytes == 0) return nullptr;
  Segment& seg = *g.seg;
  if (g.nested > 0) {
    g.backend = &backend;
    void* p = backend.alloc(bytes);
    g.inner_block_of[p] = {&seg, seg.inner_blocks.size()};
    seg.inner_blocks.push_back({p, bytes, 1});
    return p;
  }
  const size_t i = g.next_alloc++;
  if (i == seg.blocks.size()) {
    VQDDP_CHECK(g.capturing, "step graph ({}): step {} allocated more than the captured step ({} blocks)",
                g.device.str(), g.step, seg.blocks.size());
    g.backend = &backend;
    void* p = backend.alloc(bytes);
    seg.blocks.push_back({p, bytes, 0});
    g.block_of[p] = {&seg, i};
  }
  Segment::Block& b = seg.blocks[i];
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
      --it->second.first->blocks[it->second.second].holders;
      return true;
    }
    auto in = g->inner_block_of.find(p);
    if (in != g->inner_block_of.end()) {
      --in->second.first->inner_blocks[in->second.second].holders;
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
  const Segment::Block* b = g.block_at(dst);
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

namespace {

// Entry i of `from` (the capture's counts for a replay, the issued run's
// for a capture), checked: it exists, and this rank's count is `mine`.
const std::vector<int64_t>& recalled_counts(const GraphSession& g, const GraphSession::Counts& from, size_t i,
                                            int64_t mine, const char* whose) {
  VQDDP_CHECK(i < from.size(), "step graph ({}): step {} gathers row counts {} times{}, {} {}: a graphed step must do "
              "what {} did", g.device.str(), g.step, i + 1,
              g.key.empty() ? std::string() : fmt::format(" after its choices ({})", g.key), whose, from.size(), whose);
  VQDDP_CHECK(mine == from[i].first, "step graph ({}): step {}, row counts {}: this rank has {} rows, {} {}: a graphed "
              "step's sizes are those of {} (run.step_graphs false, train --step-graphs off, for steps whose batches "
              "change size)", g.device.str(), g.step, i + 1, mine, whose, from[i].first, whose);
  return from[i].second;
}

}  // namespace

std::vector<int64_t> graph_recall_counts(int64_t mine, const std::function<std::vector<int64_t>()>& gather) {
  GraphSession* g = t_graph;
  if (!g || !g->in_step) return gather();
  if (g->eager) {
    std::vector<int64_t> all = gather();
    if (g->recording) g->recording->emplace_back(mine, all);
    return all;
  }
  Segment& seg = *g->seg;
  if (!g->capturing) return recalled_counts(*g, seg.counts, g->next_counts++, mine, "the captured step");
  if (g->carry) {
    const std::vector<int64_t>& all = recalled_counts(*g, *g->carry, seg.counts.size(), mine, "its issued run");
    seg.counts.emplace_back(mine, all);
    return all;
  }
  // A graph without an issued step before: the capture gathers (the one
  // host collective graph_check_host_collective lets through).
  struct Gathering {
    bool& flag;
    explicit Gathering(bool& f) : flag(f) { flag = true; }
    ~Gathering() { flag = false; }
  } gathering(g->gathering);
  seg.counts.emplace_back(mine, gather());
  return seg.counts.back().second;
}

void graph_check_host_collective(const char* what) {
  GraphSession* g = t_graph;
  if (!g || !g->in_step || g->eager || g->gathering) return;
  VQDDP_THROW("step graph ({}): step {} runs {} of host tensors inside the step: NCCL would stage it through the "
              "device, which a graph cannot do, so a graphed step runs none on any backend (gather such numbers "
              "before the step, or recall them: graph_recall_counts)", g->device.str(), g->step, what);
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
