// Megatron's GPTDataset: sample i of a split is seq_len + 1 tokens (inputs and labels shifted by one)
// drawn through shuffle index -> sample index -> document index -> the low-level dataset, exactly as
// megatron/core/datasets/gpt_dataset.py does, so the same files, seed, sequence length, split and sample
// counts give the same token sequences in the same order.
//
// Index cache (as Megatron): under config.path_to_cache, else "<dataset_path>/cache/GPTDataset_indices"
// (Megatron joins the dataset *prefix* with "cache"), files
// "<md5>-GPTDataset-<split>-{description.txt,document_index.npy,sample_index.npy,shuffle_index.npy}" where
// md5 is that of description.txt, Megatron's json.dumps(indent=4) of (class, dataset_path, num_samples,
// index_split, random_seed, sequence_length, split, split_matrix, tokenizer). A hit needs all four files;
// a miss builds the indices (when config.may_build_cache, i.e. on the one rank that builds) and writes them
// under temporary names renamed into place, description last. Mock datasets never cache.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "megatron/data/dataset_split.h"
#include "megatron/data/gpt_index.h"
#include "megatron/data/python_json.h"
#include "megatron/data/token_sequences.h"

namespace megatron::data {

struct GPTDatasetConfig {
  uint64_t random_seed = 1234;                   // --seed
  int64_t sequence_length = 0;                   // --seq-length
  std::string split = "969,30,1";                // --split, verbatim (it enters the cache description)
  std::optional<std::string> path_to_cache;      // --data-cache-path
  bool add_extra_token_to_sequence = true;
  bool drop_last_partial_validation_sequence = true;
  PyJson tokenizer;                              // the tokenizer's unique identifiers (Megatron hashes them)
  bool mock = false;                             // --mock-data: no description, no cache
  bool may_build_cache = true;                   // false on ranks that must find the cache built by rank 0
};

class GPTDataset {
 public:
  // `sequences`: the split's range of `source`'s sequences; num_samples nullopt = one epoch.
  GPTDataset(const TokenSequences& source, std::string dataset_path, SequenceRange sequences,
             std::optional<int64_t> num_samples, Split split, GPTDatasetConfig config);

  int64_t size() const { return indices_.num_samples(); }
  int64_t sample_tokens() const { return config_.sequence_length + (config_.add_extra_token_to_sequence ? 1 : 0); }
  // Sample `index`'s tokens (sample_tokens() of them; padded with -1 only for a kept last partial sample).
  void sample(int64_t index, std::span<int64_t> tokens) const;
  std::vector<int64_t> sample(int64_t index) const;

  const GptIndices& indices() const { return indices_; }
  Split split() const { return split_; }
  std::optional<int64_t> num_samples_requested() const { return num_samples_; }
  const PyJson& unique_identifiers() const { return unique_identifiers_; }
  const std::string& unique_description() const { return unique_description_; }
  const std::string& unique_description_hash() const { return unique_description_hash_; }
  bool built_anew_on_cache_miss() const { return built_anew_; }
  std::filesystem::path cache_directory() const { return cache_directory_; }

 private:
  GptIndexRequest index_request() const;
  GptIndices build() const;
  bool load_cache();
  void save_cache() const;
  std::filesystem::path cache_file(const std::string& affix) const;

  const TokenSequences* source_;
  std::string dataset_path_;
  SequenceRange sequences_;
  std::optional<int64_t> num_samples_;
  Split split_;
  GPTDatasetConfig config_;
  PyJson unique_identifiers_;
  std::string unique_description_, unique_description_hash_;
  std::filesystem::path cache_directory_;
  GptIndices indices_;
  bool built_anew_ = false;
};

// Megatron's split_matrix as its description renders it (the first book-end starts at the int 0).
PyJson split_matrix_json(const SplitBookends& bookends);

// The datasets of the three splits of one low-level dataset (absent where the split has zero width), as
// BlendedMegatronDatasetBuilder._build_megatron_dataset_splits does; sizes are the samples per split.
std::array<std::optional<GPTDataset>, kNumSplits> build_gpt_dataset_splits(
    const TokenSequences& source, const std::string& dataset_path,
    const std::array<std::optional<int64_t>, kNumSplits>& sizes, const GPTDatasetConfig& config);

}  // namespace megatron::data
