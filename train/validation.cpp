#include "train/validation.h"

#include <cmath>
#include <numeric>
#include <optional>

#include "comm/agree.h"
#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "train/schedule.h"
#include "train/spectral.h"
#include "train/stoi.h"
#include "vq/perplexity.h"

namespace vqddp {

namespace {

// Per-layer code histograms of indices (M, Q) on any device, appended to
// `out` (sizes[l] floats per layer; -1 entries are skipped).
void append_histograms(const Tensor& indices, const std::vector<int64_t>& sizes, std::vector<float>& out) {
  int64_t m = indices.size(0), q = indices.size(1);
  size_t base = out.size();
  for (int64_t k : sizes) out.resize(out.size() + k, 0.f);
  Tensor host = indices.to(Device::cpu());
  const int64_t* pi = host.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    size_t at = base;
    for (int64_t l = 0; l < q; ++l) {
      int64_t c = pi[i * q + l];
      VQDDP_CHECK(c < sizes[l], "index {} of layer {} outside its codebook of {}", c, l, sizes[l]);
      if (c >= 0) out[at + c] += 1.f;
      at += sizes[l];
    }
  }
}

// A chunk's row of sums: sum x^2, sum err^2, elements, log-mel sum and
// count, rows skipped (data.bad_files "skip"), each STFT resolution's
// distance sum and count, the chunk's STOI and 1 (or 0 and 0 when the chunk
// is too short or too quiet for one STOI segment: the mean is over the
// chunks that have one).
constexpr int64_t kStftAt = 6, kStoiAt = kStftAt + 2 * static_cast<int64_t>(kStftLossResolutions.size());
constexpr int64_t kRowWidth = kStoiAt + 2;

// The audio measures of held-out chunks (absent for images). Audio: the
// log-mel L1 distance of 32 ms windows (hop 8 ms, 40 mels) over each
// chunk's frames laid end to end, which are consecutive samples of the
// held-out clips whatever data.frame is, so the MLP's 40-sample frames and
// the conv codec's segments are measured alike; and the multi-resolution
// STFT distance, at the STFT loss's resolutions; and STOI.
struct AudioMeasures {
  double rate;
  LogMel mel;
  std::vector<Stft> stfts;
  explicit AudioMeasures(double r) : rate(r), mel(held_out_log_mel(r)) {
    for (auto [n_fft, hop] : kStftLossResolutions) stfts.emplace_back(n_fft, hop);
  }
};

// The row of one chunk: x and y (n, F) on the host, measured as the
// chunk's one row laid end to end, with no copy.
std::vector<float> chunk_row(const Tensor& x, const Tensor& y, int64_t skipped, const AudioMeasures* audio) {
  const float *px = x.data<float>(), *py = y.data<float>();
  const int64_t n = x.numel();
  SumCount mel_l1;
  if (audio && n >= 256) mel_l1 = log_mel_l1_against(audio->mel, audio->mel.host(px, n), py, n);
  double signal = 0, error = 0;
  for (int64_t i = 0; i < n; ++i) {
    signal += double(px[i]) * px[i];
    error += (double(px[i]) - py[i]) * (double(px[i]) - py[i]);
  }
  std::vector<float> row{static_cast<float>(signal), static_cast<float>(error), static_cast<float>(n),
                         static_cast<float>(mel_l1.sum), static_cast<float>(mel_l1.count),
                         static_cast<float>(skipped)};
  for (size_t r = 0; r < kStftLossResolutions.size(); ++r) {
    SumCount d;
    if (audio && n >= kStftLossResolutions.back().first)
      d = stft_distance_against(audio->stfts[r], stft_reference(audio->stfts[r], px, n), py, n);
    row.insert(row.end(), {static_cast<float>(d.sum), static_cast<float>(d.count)});
  }
  std::optional<double> intelligibility;
  if (audio)
    intelligibility = stoi_if_scorable(std::vector<float>(px, px + n), std::vector<float>(py, py + y.numel()),
                                       static_cast<int>(std::lround(audio->rate)));
  row.insert(row.end(), {static_cast<float>(intelligibility.value_or(0)), intelligibility ? 1.f : 0.f});
  return row;
}

// The measures from the world's summed row.
void summarise(const float* p, bool audio, Validation& v) {
  v.mse = p[2] > 0 ? p[1] / p[2] : 0;
  v.snr_db = p[1] > 0 ? 10 * std::log10(double(p[0]) / p[1]) : 0;
  if (audio) {
    v.log_mel = p[4] > 0 ? p[3] / p[4] : 0;
    v.stft_distance = 0;
    const size_t res = kStftLossResolutions.size();
    for (size_t r = 0; r < res; ++r)
      v.stft_distance += p[kStftAt + 1 + 2 * r] > 0 ? p[kStftAt + 2 * r] / p[kStftAt + 1 + 2 * r] / static_cast<double>(res) : 0;
    if (p[kStoiAt + 1] > 0) v.stoi = p[kStoiAt] / p[kStoiAt + 1];
  }
  v.skipped = static_cast<int64_t>(p[5]);
}

}  // namespace

std::vector<LayerUsage> usage_of(const float* hist, const std::vector<int64_t>& sizes) {
  std::vector<LayerUsage> out;
  for (int64_t k : sizes) {
    LayerUsage u;
    u.codebook_size = k;
    u.perplexity = perplexity(hist, k);
    for (int64_t c = 0; c < k; ++c) u.codes_used += hist[c] > 0;
    out.push_back(u);
    hist += k;
  }
  return out;
}

Validation validate(CodecModel& model, const Dataset& data, Communicator& comm, Device device, int64_t done) {
  NoGradGuard no_grad;
  model.eval();
  // 2^16 values (41 frames of 1600 samples): W ranks validate their chunks
  // each in its own phase, so the process holds up to W chunks' working
  // sets at once, and the more chunks they run, the nearer their peaks
  // meet. At 2^18 a chunk of the main job held some 35 MiB per rank and its
  // peak RSS rose 1.20x from 20 to 200 held-out clips on 4 thread ranks
  // (bench_validation_memory); at 2^16 a chunk holds about what a training
  // step does, and the peak stays flat.
  constexpr int64_t kChunkValues = int64_t{1} << 16;
  const int64_t kChunk = std::max<int64_t>(1, kChunkValues / data.example_dim);
  const int64_t rows = data.validation.rows(), chunks = (rows + kChunk - 1) / kChunk;
  std::vector<int64_t> rank_chunks = even_shards(chunks, comm.world_size());
  int64_t first = shard_begin(rank_chunks, comm.rank());
  std::vector<int64_t> sizes = model.layer_sizes();
  int64_t codes = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::optional<AudioMeasures> audio;
  if (data.examples_per_second > 0) audio.emplace(data.examples_per_second * static_cast<double>(data.example_dim));
  // The code histogram of every layer is counted per rank and summed by one
  // all_reduce of integers (exact in any order): as a chunk's columns it
  // made each chunk's row 4 KiB for the main job, kept until the end, so a
  // rank's memory grew with the held-out set.
  std::vector<float> packed, chunk_histogram;
  std::vector<int64_t> histogram(static_cast<size_t>(codes), 0);
  // A chunk that fails on one rank (a non-finite reconstruction, say)
  // fails every rank here, not in reduce_units at their timeout.
  agree_on(comm, true, [&] {
    for (int64_t c = first; c < first + rank_chunks[comm.rank()]; ++c) {
      const int64_t begin = c * kChunk, end = std::min(rows, (c + 1) * kChunk);
      Tensor x;  // (n, F)
      int64_t skipped = 0;
      try {
        x = data.validation.read_range(begin, end, data.skip_bad_rows, &skipped);
      } catch (const Error& e) {
        VQDDP_THROW("validation at step {}: reading held-out rows {} to {}: {}", done, begin, end, e.what());
      }
      ModelOutput out = model.forward(x.to(device), comm);
      Tensor y = out.reconstruction.to(Device::cpu());  // (n, F)
      std::vector<float> row;
      try {
        row = chunk_row(x, y, skipped, audio ? &*audio : nullptr);
      } catch (const Error& e) {
        VQDDP_THROW("validation at step {}: measuring held-out rows {} to {}: {}", done, begin, end, e.what());
      }
      chunk_histogram.clear();
      append_histograms(out.indices, sizes, chunk_histogram);
      for (int64_t i = 0; i < codes; ++i) histogram[i] += static_cast<int64_t>(chunk_histogram[i]);
      packed.insert(packed.end(), row.begin(), row.end());
    }
  });
  Tensor mine = from_vector(packed, {rank_chunks[comm.rank()], kRowWidth});
  Tensor t = empty({kRowWidth});
  comm.reduce_units(mine, rank_chunks, t);
  Tensor counts = from_vector(histogram, {codes});
  if (codes > 0) comm.all_reduce(counts, ReduceOp::sum);
  Validation v;
  summarise(t.data<float>(), audio.has_value(), v);
  const int64_t* total = counts.data<int64_t>();
  v.histogram.assign(total, total + codes);
  v.usage = usage_of(v.histogram.data(), sizes);
  model.train();
  return v;
}

}  // namespace vqddp
