// Megatron's mock GPT data (--mock-data; MockGPTLowLevelDataset in gpt_dataset.py): 100000 sequences whose
// lengths are numpy.random.default_rng(0).integers(1, 4096, 100000, dtype=int32); sequence i holds the
// tokens 1, 2, ..., length - 1 followed by the end-of-document id. Megatron forces the split "1,1,1" for mock
// data and never caches its indices; build_mock_gpt_datasets does the same.
#pragma once

#include <array>
#include <optional>

#include "megatron/data/gpt_dataset.h"
#include "megatron/data/token_sequences.h"

namespace megatron::data {

class MockGPTLowLevelDataset final : public TokenSequences {
 public:
  static constexpr uint64_t kSeed = 0;
  static constexpr int64_t kSize = 100000;
  static constexpr int32_t kMaxSequenceLength = 4096;

  explicit MockGPTLowLevelDataset(int64_t eod_token);
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const override;

 private:
  int64_t eod_;
  std::vector<int32_t> lengths_;
};

// The mock datasets of the three splits (config.split is replaced by "1,1,1", config.mock set).
std::array<std::optional<GPTDataset>, kNumSplits> build_mock_gpt_datasets(
    const MockGPTLowLevelDataset& source, const std::array<std::optional<int64_t>, kNumSplits>& sizes,
    GPTDatasetConfig config);

}  // namespace megatron::data
