#include "megatron/data/mock_gpt_dataset.h"

#include "megatron/core/error.h"
#include "megatron/data/numpy_generator.h"

namespace megatron::data {

MockGPTLowLevelDataset::MockGPTLowLevelDataset(int64_t eod_token) : eod_(eod_token) {
  NumpyGenerator generator(kSeed);
  lengths_ = generator.integers_int32(1, kMaxSequenceLength, kSize);
}

void MockGPTLowLevelDataset::read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const {
  MEGATRON_CHECK(sequence >= 0 && sequence < kSize, "mock data: sequence ", sequence, " out of range [0, ", kSize, ")");
  const int64_t length = lengths_[static_cast<size_t>(sequence)];
  MEGATRON_CHECK(offset >= 0 && offset + static_cast<int64_t>(dst.size()) <= length, "mock data: tokens [", offset,
                 ", ", offset + static_cast<int64_t>(dst.size()), ") out of range for sequence ", sequence,
                 " of length ", length);
  for (size_t i = 0; i < dst.size(); ++i) {
    const int64_t position = offset + static_cast<int64_t>(i);
    dst[i] = position == length - 1 ? eod_ : position + 1;
  }
}

std::array<std::optional<GPTDataset>, kNumSplits> build_mock_gpt_datasets(
    const MockGPTLowLevelDataset& source, const std::array<std::optional<int64_t>, kNumSplits>& sizes,
    GPTDatasetConfig config) {
  config.mock = true;
  config.split = "1,1,1";
  config.path_to_cache.reset();
  return build_gpt_dataset_splits(source, "", sizes, config);
}

}  // namespace megatron::data
