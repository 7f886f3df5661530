#include <fmt/format.h>

#include "comm/agree.h"
#include "vq/codebook.h"
#include "vq/perplexity.h"

namespace vqddp {

struct CodebookMetrics::State {
  Tensor stats;  // the device form until read (undefined for host numbers)
  StatsLayout layout;
  bool read = false;
  double perplexity = 0;
  int64_t codes_used = 0, codes_revived = 0, rows = 0;
  std::vector<double> flags;  // one per rank
};

CodebookMetrics CodebookMetrics::of(double perplexity, int64_t codes_used, int64_t codes_revived, int64_t rows) {
  CodebookMetrics m;
  m.state_ = std::make_shared<State>();
  m.state_->read = true;
  m.state_->perplexity = perplexity;
  m.state_->codes_used = codes_used;
  m.state_->codes_revived = codes_revived;
  m.state_->rows = rows;
  return m;
}

CodebookMetrics CodebookMetrics::on_device(const Tensor& stats, const StatsLayout& layout) {
  CodebookMetrics m;
  m.state_ = std::make_shared<State>();
  // Only the counts and the tail (flags, revived) are kept, copied on the
  // device (no wait): a run that keeps every step's metrics (replay) does not
  // keep every step's K x D sums.
  Tensor flat = stats.reshape({-1});
  m.state_->stats = concat({flat.slice_rows(0, layout.k), flat.slice_rows(layout.flag(0), layout.size())});
  m.state_->layout = layout;
  return m;
}

const CodebookMetrics::State& CodebookMetrics::host() const {
  // A step that did not update (eval, no-grad): all zero, perplexity 0 too.
  // (An update whose world batch had no rows reads perplexity 1 instead:
  // vq/perplexity.h on all-zero counts, or empty_world().)
  static const State none = [] {
    State s;
    s.read = true;
    return s;
  }();
  if (!state_) return none;
  State& s = *state_;
  if (!s.read) {
    // The counts and the tail (flags, revived), read in one copy.
    const StatsLayout& l = s.layout;
    std::vector<double> h = s.stats.to_vector<double>();
    s.perplexity = vqddp::perplexity(h.data(), l.k);
    for (int64_t c = 0; c < l.k; ++c) {
      s.codes_used += h[c] > 0;
      s.rows += static_cast<int64_t>(h[c]);
    }
    s.flags.assign(h.begin() + l.k, h.begin() + l.k + l.world);
    s.codes_revived = static_cast<int64_t>(h[l.k + l.world]);
    s.stats = Tensor();  // read: the buffer can go
    s.read = true;
  }
  return s;
}

double CodebookMetrics::perplexity() const {
  check();
  return host().perplexity;
}
int64_t CodebookMetrics::codes_used() const {
  check();
  return host().codes_used;
}
int64_t CodebookMetrics::rows() const {
  check();
  return host().rows;
}
int64_t CodebookMetrics::codes_revived() const {
  check();
  return host().codes_revived;
}

void CodebookMetrics::check() const {
  const State& s = host();
  if (s.flags.empty()) return;  // host numbers: no flags
  std::string bad = nonfinite_flags_message(s.flags.data(), s.layout.world, s.layout.cols);
  if (!bad.empty()) VQDDP_THROW_NONFINITE_EVERY_RANK("{}", bad);
}

}  // namespace vqddp
