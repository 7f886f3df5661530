// Perplexity of a code histogram: exp(entropy) of counts / sum(counts), the
// "effective number of codes in use" every VQ log reports. One definition
// for the codebook metrics, the trainer's logs and `vqddp inspect`.
#pragma once

#include <cmath>
#include <cstdint>

namespace vqddp {

// 1 for an empty histogram (no rows: one "effective" code, as for a single one).
template <class T>
double perplexity(const T* counts, int64_t k) {
  double total = 0, entropy = 0;
  for (int64_t i = 0; i < k; ++i) total += counts[i];
  if (total <= 0) return 1.0;
  for (int64_t i = 0; i < k; ++i)
    if (counts[i] > 0) {
      double p = counts[i] / total;
      entropy -= p * std::log(p);
    }
  return std::exp(entropy);
}

}  // namespace vqddp
