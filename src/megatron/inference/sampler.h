// Next-token choice from logits: greedy, or sampling with temperature, top-k and top-p (nucleus).
//
// pick(logits, vocab, step): logits are one row of host floats; only ids < vocab are candidates (the
// padded rows of the output layer never are). Greedy (temperature 0): the first maximum. Otherwise
// p = softmax(logits / temperature) restricted to the top_k largest (0: all), then to the smallest prefix,
// in descending order, whose mass reaches top_p (1: all), renormalised; the id is drawn with one uniform
// from Philox (seed, offset = step), so a seed and the same logits give the same text on every machine.
#pragma once

#include <cstdint>
#include <span>

namespace megatron::inference {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 1234;
};

// Throws megatron::Error on temperature < 0, top_k < 0 or top_p outside (0, 1].
void validate(const SamplingOptions& options);
int64_t pick(std::span<const float> logits, int64_t vocab, uint64_t step, const SamplingOptions& options);

}  // namespace megatron::inference
