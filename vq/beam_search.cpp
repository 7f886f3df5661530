#include "vq/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

struct Path {
  double score = 0;
  std::vector<float> residual;
  std::vector<int64_t> codes;
};

struct Candidate {
  double score;
  int64_t beam, rank, code;
  bool operator<(const Candidate& o) const {
    if (score != o.score) return score < o.score;
    if (beam != o.beam) return beam < o.beam;
    return rank < o.rank;
  }
};

// The residual as the codebook compares it: unit length for cosine (the
// codebook's l2 normalisation, clamped as engine/ops' at 1e-12).
std::vector<double> compared(const std::vector<float>& r, bool cosine) {
  std::vector<double> v(r.begin(), r.end());
  if (!cosine) return v;
  double norm = 0;
  for (double e : v) norm += e * e;
  norm = std::sqrt(std::max(norm, 1e-24));
  for (double& e : v) e /= norm;
  return v;
}

}  // namespace

Tensor beam_search(const Tensor& z_in, const std::vector<Tensor>& codebooks, const BeamSearchOptions& o) {
  VQDDP_CHECK(o.beam > 1, "beam search: beam {} must be at least 2", o.beam);
  VQDDP_CHECK(!codebooks.empty() && o.weights.size() == codebooks.size(),
              "beam search: {} weights for {} layers", o.weights.size(), codebooks.size());
  const Tensor z = to_device(z_in.detach(), Device::cpu());
  VQDDP_CHECK(z.dtype() == DType::f32 && z.dim() == 2, "beam search: expected float32 rows [M, D], got {}", z.desc());
  const int64_t m = z.size(0), d = z.size(1), layers = static_cast<int64_t>(codebooks.size());
  std::vector<Tensor> books;
  for (const Tensor& c : codebooks) {
    books.push_back(to_device(c.detach(), Device::cpu()));
    VQDDP_CHECK(books.back().dim() == 2 && books.back().size(1) == d, "beam search: codebook {} for rows of width {}",
                books.back().desc(), d);
  }
  Tensor out = empty({m, layers}, DType::i64, Device::cpu());
  int64_t* po = out.data<int64_t>();
  const float* pz = z.data<float>();
  for (int64_t row = 0; row < m; ++row) {
    std::vector<Path> beams{{0.0, std::vector<float>(pz + row * d, pz + (row + 1) * d), {}}};
    for (int64_t l = 0; l < layers; ++l) {
      const float* pc = books[l].data<float>();
      const int64_t k = books[l].size(0);
      const int keep_codes = static_cast<int>(std::min<int64_t>(o.beam, k));
      std::vector<Candidate> candidates;
      for (size_t b = 0; b < beams.size(); ++b) {
        const std::vector<double> r = compared(beams[b].residual, o.cosine);
        std::vector<std::pair<double, int64_t>> err(k);
        for (int64_t c = 0; c < k; ++c) {
          double s = 0;
          for (int64_t j = 0; j < d; ++j) {
            const double e = double(pc[c * d + j]) - r[j];
            s += e * e;
          }
          // A non-finite row (refused by the update's flags after this)
          // must still give a strict order here.
          err[c] = {std::isnan(s) ? INFINITY : s / double(d), c};
        }
        std::partial_sort(err.begin(), err.begin() + keep_codes, err.end());
        for (int i = 0; i < keep_codes; ++i)
          candidates.push_back({beams[b].score + double(o.weights[l]) * err[i].first, static_cast<int64_t>(b), i,
                                err[i].second});
      }
      const size_t keep = l + 1 == layers ? 1 : std::min<size_t>(o.beam, candidates.size());
      std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end());
      std::vector<Path> next;
      for (size_t i = 0; i < keep; ++i) {
        const Candidate& c = candidates[i];
        Path p = beams[c.beam];
        p.score = c.score;
        // The next layer's residual: this one minus the code, in float as
        // the forward subtracts (for cosine the unit residual's code).
        for (int64_t j = 0; j < d; ++j) p.residual[j] -= pc[c.code * d + j];
        p.codes.push_back(c.code);
        next.push_back(std::move(p));
      }
      beams = std::move(next);
    }
    std::copy(beams[0].codes.begin(), beams[0].codes.end(), po + row * layers);
  }
  return out;
}

}  // namespace vqddp
