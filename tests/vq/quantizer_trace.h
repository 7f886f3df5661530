// A few training steps of one rank of a quantizer made by the factory, on
// its shard of each step's global batch, recorded for the DDP invariants
// (docs/design.md section 7): tests/vq/test_quantizer.cpp runs it on
// thread ranks, tests/comm/mpi_peer.cpp on MPI processes, each against 1
// rank on the whole batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/core/streams.h"
#include "tests/vq/factory_options.h"
#include "tests/vq/harness.h"
#include "vq/quantizer_options.h"

namespace vqddp::test {

inline constexpr int64_t kDim = 8, kRows = 24;
inline constexpr int kSteps = 3;

inline std::shared_ptr<Quantizer> make(const QuantizerOptions& q) {
  Generator gen(11, streams::kInit);
  return make_quantizer(q, kDim, /*seed=*/5, gen);
}

struct Trace {
  std::vector<NamedTensors> states;                  // after each step
  std::vector<std::vector<CodebookMetrics>> metrics;  // each step's, from the global counts
  std::vector<Tensor> quantized, indices;            // each step's rows of this rank
};

// Steps of one rank on its shard of each step's global batch.
inline Trace run(const QuantizerOptions& q, Communicator& comm, const std::vector<int64_t>& sizes) {
  std::shared_ptr<Quantizer> m = make(q);
  m->train();
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    Generator data(100 + s);
    Tensor x = rand_normal({kRows, kDim}, data);
    QuantizerOutput out = m->quantize(shard(x, sizes, comm.rank()), comm);
    t.quantized.push_back(out.quantized.detach().clone());
    t.indices.push_back(out.indices.clone());
    t.states.push_back(snapshot(*m));
    t.metrics.push_back(out.metrics);
  }
  return t;
}

}  // namespace vqddp::test
