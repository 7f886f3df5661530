#include "comm/fingerprint.h"

#include <fmt/format.h>

namespace vqddp {

std::string Fingerprint::str() const {
  if (kind == "barrier") return kind;
  std::string s = fmt::format("{} {} x{}", kind, dtype_name(dtype), numel);
  if (root >= 0) s += fmt::format(" root={}", root);
  if (!counts.empty()) s += fmt::format(" rows=[{}]", fmt::join(counts, ","));
  return s;
}

namespace {

// Kinds by wire code (the index); 0 is reserved so zeroed words never pass
// for a real call.
constexpr const char* kKinds[] = {"?",          "all_reduce(sum)", "all_reduce(avg)", "all_reduce(max)",
                                  "all_reduce(min)", "broadcast",   "all_gather",      "all_gather_rows",
                                  "barrier"};
constexpr int64_t kKindCount = sizeof(kKinds) / sizeof(kKinds[0]);

// FNV-1a over the counts: equal counts give equal hashes on every rank.
int64_t hash_counts(const std::vector<int64_t>& counts) {
  if (counts.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (int64_t c : counts)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(c) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  return static_cast<int64_t>(h);
}

}  // namespace

FingerprintWords encode_fingerprint(const Fingerprint& fp, uint64_t seq) {
  int64_t kind = 0;
  for (int64_t k = 1; k < kKindCount; ++k)
    if (fp.kind == kKinds[k]) kind = k;
  return {kind, static_cast<int64_t>(fp.dtype), fp.numel, fp.root, hash_counts(fp.counts), static_cast<int64_t>(seq)};
}

std::string describe_fingerprint(const FingerprintWords& w) {
  std::string kind = w[0] > 0 && w[0] < kKindCount ? kKinds[w[0]] : fmt::format("unknown collective {}", w[0]);
  std::string s = fmt::format("#{} {}", w[5], kind);
  if (kind == "barrier") return s;
  std::string dtype = fmt::format("dtype{}", w[1]);
  for (DType t : {DType::f32, DType::i64, DType::f64})
    if (w[1] == static_cast<int64_t>(t)) dtype = dtype_name(t);
  s += fmt::format(" {} x{}", dtype, w[2]);
  if (w[3] >= 0) s += fmt::format(" root={}", w[3]);
  if (w[4] != 0) s += fmt::format(" rows-hash={:016x}", static_cast<uint64_t>(w[4]));
  return s;
}

std::string desync_message(uint64_t seq, const std::vector<std::string>& per_rank) {
  std::string each;
  for (size_t r = 0; r < per_rank.size(); ++r) each += fmt::format("\n  rank {}: {}", r, per_rank[r]);
  return fmt::format("collective #{}: ranks called different collectives:{}", seq, each);
}

}  // namespace vqddp
