// The low-level dataset under the GPT index cache that fuzz_npy_cache feeds and fuzz_make_seeds builds a
// real cache for: 12 sequences of 1..12 tokens (token t of sequence s is s * 100 + t). Reading outside a
// sequence aborts: a cache that passed the dataset's checks must never ask for that.
#pragma once

#include <cstdlib>
#include <vector>

#include "megatron/data/gpt_dataset.h"
#include "megatron/data/token_sequences.h"

namespace megatron::fuzz {

class SmallSequences final : public data::TokenSequences {
 public:
  static constexpr int32_t kCount = 12;
  SmallSequences() {
    for (int32_t s = 0; s < kCount; ++s) lengths_.push_back(s + 1);
  }
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void read_tokens(int64_t sequence, int64_t offset, std::span<int64_t> dst) const override {
    if (sequence < 0 || sequence >= kCount || offset < 0 ||
        offset + int64_t(dst.size()) > lengths_[size_t(sequence)])
      std::abort();
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = sequence * 100 + offset + int64_t(i);
  }

 private:
  std::vector<int32_t> lengths_;
};

// The dataset both build: the train split of every sequence, 20 samples of 4 tokens, seed 7.
inline data::GPTDatasetConfig small_dataset_config(const std::string& cache, bool may_build) {
  data::GPTDatasetConfig config;
  config.sequence_length = 4;
  config.random_seed = 7;
  config.split = "1";
  config.path_to_cache = cache;
  config.may_build_cache = may_build;
  return config;
}
inline constexpr int64_t kSmallDatasetSamples = 20;

}  // namespace megatron::fuzz
