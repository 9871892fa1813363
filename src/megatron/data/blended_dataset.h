// Megatron's BlendedDataset (megatron/core/datasets/blended_dataset.py, helpers.cpp build_blending_indices):
// weights normalised as numpy does; sample i goes to the dataset d maximising
// w_d * max(i, 1) - (samples already taken from d) (first maximum wins), giving dataset_index (int16) and
// dataset_sample_index (int64, the running count of d). For `--data-path w1 A w2 B` and a split of S samples
// each component is asked for ceil(ceil(S * w) * (1 + surplus)) samples (surplus 0.005, the mid-level
// surplus) and the blend holds sum(ceil(S * w)) samples.
// Cache (only with a cache directory, as Megatron): "<md5>-BlendedDataset-<split>-{description.txt,
// dataset_index.npy,dataset_sample_index.npy}" (split: train, valid or test, the components' index split),
// md5 of json.dumps(indent=4) of (class, datasets' unique identifiers, split, weights, size).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/data/gpt_dataset.h"

namespace megatron::data {

constexpr double kMidLevelDatasetSurplus = 0.005;

// int(ceil(ceil(target_size * w) * (1 + surplus))) for each normalised weight w.
std::vector<int64_t> blend_sizes_per_dataset(std::span<const double> normalized_weights, int64_t target_size,
                                             double surplus);

struct BlendingIndices {
  std::vector<int16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};
BlendingIndices build_blending_indices(std::span<const double> normalized_weights, int64_t size);

class BlendedDataset {
 public:
  // weights need not be normalised (they are, twice, as Megatron does); datasets outlive this object.
  BlendedDataset(std::vector<const GPTDataset*> datasets, std::vector<double> weights, int64_t size,
                 std::optional<std::string> path_to_cache = std::nullopt, bool may_build_cache = true);

  int64_t size() const { return size_; }
  // (dataset id, sample id within it) of blended sample i.
  std::pair<int, int64_t> locate(int64_t index) const;
  void sample(int64_t index, std::span<int64_t> tokens) const;
  const BlendingIndices& indices() const { return indices_; }
  const std::vector<double>& weights() const { return weights_; }
  const std::string& unique_description() const { return unique_description_; }
  const std::string& unique_description_hash() const { return unique_description_hash_; }

 private:
  std::vector<const GPTDataset*> datasets_;
  std::vector<double> weights_;
  int64_t size_;
  std::string unique_description_, unique_description_hash_;
  BlendingIndices indices_;
};

}  // namespace megatron::data
