// What a collective call is, as every rank must agree on it: kind (with the
// reduce op), dtype, element count (per row for the gather of rows), root,
// and per-rank row counts. Communicator's collectives build it, once per
// call, and hand it to the backend's transport, which compares all ranks'
// fingerprints before moving any data: the thread backend always, MPI and
// NCCL with their collective check on.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace vqddp {

struct Fingerprint {
  Fingerprint() = default;
  Fingerprint(std::string k, DType t, int64_t n, int r = -1, std::vector<int64_t> c = {})
      : kind(std::move(k)), dtype(t), numel(n), root(r), counts(std::move(c)) {}

  // "all_reduce(sum)", "broadcast", "all_gather", "all_gather_rows", "barrier";
  // also "reduce_units", compared by the thread backend only (it has no wire
  // code: the default reduce_units is an all_gather_rows on the wire).
  std::string kind;
  DType dtype = DType::f32;
  int64_t numel = 0;             // elements per rank (per row for all_gather_rows, reduce_units)
  int root = -1;                 // broadcast only
  std::vector<int64_t> counts;   // all_gather_rows, reduce_units only
  bool operator==(const Fingerprint&) const = default;
  std::string str() const;  // "all_reduce(sum) float32 x1000"
};

// The fingerprint as a few int64 words, for backends whose ranks live in
// different processes and compare fingerprints with a tiny all_gather
// (MPI and NCCL with their collective check on; the comparison is
// Communicator::fingerprint_mismatch). The per-rank counts of
// all_gather_rows travel as a hash; `seq` is the caller's sequence number.
constexpr int kFingerprintWords = 6;
using FingerprintWords = std::array<int64_t, kFingerprintWords>;
FingerprintWords encode_fingerprint(const Fingerprint& fp, uint64_t seq);
// "#12 all_reduce(sum) float32 x1000", from the words (any values: a
// corrupted or unknown kind is printed as such, never trusted).
std::string describe_fingerprint(const FingerprintWords& words);

// The error text when ranks disagree at collective #seq: one line per rank.
std::string desync_message(uint64_t seq, const std::vector<std::string>& per_rank);

}  // namespace vqddp
