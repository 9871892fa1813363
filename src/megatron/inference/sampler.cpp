#include "megatron/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/philox.h"

namespace megatron::inference {

void validate(const SamplingOptions& o) {
  MEGATRON_CHECK(o.temperature >= 0, "--temperature ", o.temperature, " must be >= 0 (0: greedy)");
  MEGATRON_CHECK(o.top_k >= 0, "--top-k ", o.top_k, " must be >= 0 (0: no limit)");
  MEGATRON_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p ", o.top_p, " must be in (0, 1]");
}

int64_t pick(std::span<const float> logits, int64_t vocab, uint64_t step, const SamplingOptions& o) {
  const int64_t V = std::min<int64_t>(vocab, int64_t(logits.size()));
  MEGATRON_CHECK(V > 0, "sampler: no candidate tokens (vocab ", vocab, ", ", logits.size(), " logits)");
  if (o.temperature == 0.0) return int64_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
  std::vector<int64_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  // Descending by logit; ties by id, so the order is deterministic.
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  if (o.top_k > 0 && o.top_k < V) ids.resize(size_t(o.top_k));
  const double top = double(logits[size_t(ids[0])]) / o.temperature;
  std::vector<double> p(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) total += p[i] = std::exp(double(logits[size_t(ids[i])]) / o.temperature - top);
  if (o.top_p < 1.0) {
    double mass = 0;
    size_t keep = 0;
    while (keep < p.size() && mass < o.top_p * total) mass += p[keep++];
    p.resize(std::max<size_t>(keep, 1));
    total = std::accumulate(p.begin(), p.end(), 0.0);
  }
  const double u = double(philox_uniform(o.seed, step, 0)) * total;
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[p.size() - 1];
}

}  // namespace megatron::inference
