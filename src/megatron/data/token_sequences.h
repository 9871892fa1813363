// What a GPT dataset needs from a low-level dataset: the length of every sequence and a way to read a
// window of one sequence's tokens widened to int64. IndexedDatasetReader (.bin/.idx) and
// MockGPTLowLevelDataset (--mock-data) provide it.
#pragma once

#include <cstdint>
#include <span>

namespace megatron::data {

class TokenSequences {
 public:
  virtual ~TokenSequences() = default;
  virtual std::span<const int32_t> sequence_lengths() const = 0;
  // Writes tokens [offset, offset + dst.size()) of sequence `sequence` into dst; throws when out of range.
  virtual void read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const = 0;
};

}  // namespace megatron::data
