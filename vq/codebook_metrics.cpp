#include <fmt/format.h>

#include "vq/codebook.h"
#include "vq/vq_kernels.h"

namespace vqddp {

struct CodebookMetrics::State {
  Tensor stats, summary;  // device form (stats undefined for host numbers)
  StatsLayout layout;
  std::vector<double> host;  // the summary on the host, once read
};

CodebookMetrics CodebookMetrics::of(double perplexity, int64_t codes_used, int64_t codes_revived, int64_t rows) {
  CodebookMetrics m;
  m.state_ = std::make_shared<State>();
  m.state_->host = {perplexity, static_cast<double>(codes_used), static_cast<double>(rows),
                    static_cast<double>(codes_revived)};
  return m;
}

CodebookMetrics CodebookMetrics::on_device(Tensor stats, const StatsLayout& layout, Tensor summary) {
  CodebookMetrics m;
  m.state_ = std::make_shared<State>();
  m.state_->stats = std::move(stats);
  m.state_->summary = std::move(summary);
  m.state_->layout = layout;
  return m;
}

const std::vector<double>& CodebookMetrics::host() const {
  static const std::vector<double> none(CodeSummary::kFlags, 0.0);  // a step that did not update: all zero
  if (!state_) return none;
  State& s = *state_;
  if (s.host.empty()) {
    // Summarised only now, when someone asks: a step that is not logged
    // never computes its perplexity, and never waits for it.
    vq_kernels(s.summary.device()).summarise(s.stats, s.layout, s.summary);
    s.host = s.summary.to_vector<double>();  // the one read
  }
  return s.host;
}

double CodebookMetrics::perplexity() const {
  check();
  return host()[CodeSummary::kPerplexity];
}
int64_t CodebookMetrics::codes_used() const {
  check();
  return static_cast<int64_t>(host()[CodeSummary::kCodesUsed]);
}
int64_t CodebookMetrics::rows() const {
  check();
  return static_cast<int64_t>(host()[CodeSummary::kRows]);
}
int64_t CodebookMetrics::codes_revived() const {
  check();
  return static_cast<int64_t>(host()[CodeSummary::kRevived]);
}

const Tensor& CodebookMetrics::summary() const {
  static const Tensor none;
  return state_ ? state_->summary : none;
}

void CodebookMetrics::check() const {
  const std::vector<double>& h = host();
  if (h.size() <= static_cast<size_t>(CodeSummary::kFlags)) return;  // host numbers, or none: no flags
  std::string bad = nonfinite_flags_message(h.data() + CodeSummary::kFlags, state_->layout.world, state_->layout.cols);
  if (!bad.empty()) VQDDP_THROW_NONFINITE("{}", bad);
}

}  // namespace vqddp
