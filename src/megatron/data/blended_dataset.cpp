#include "megatron/data/blended_dataset.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "megatron/core/error.h"
#include "megatron/data/dataset_split.h"
#include "megatron/data/md5.h"
#include "megatron/data/npy_file.h"

namespace megatron::data {

std::vector<int64_t> blend_sizes_per_dataset(std::span<const double> normalized_weights, int64_t target_size,
                                             double surplus) {
  std::vector<int64_t> sizes;
  for (double w : normalized_weights)
    sizes.push_back(static_cast<int64_t>(
        std::ceil(std::ceil(static_cast<double>(target_size) * w) * (1.0 + surplus))));
  return sizes;
}

BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size) {
  MEGATRON_CHECK(!weights.empty() && weights.size() < 32767, "blending needs 1 to 32766 datasets, found ",
                 weights.size());
  BlendingIndices out;
  out.dataset_index.resize(static_cast<size_t>(size));
  out.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double position = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * position - static_cast<double>(taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * position - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    out.dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    out.dataset_sample_index[static_cast<size_t>(i)] = taken[best]++;
  }
  return out;
}

BlendedDataset::BlendedDataset(std::vector<const GPTDataset*> datasets, std::vector<double> weights, int64_t size,
                               std::optional<std::string> path_to_cache, bool may_build_cache)
    : datasets_(std::move(datasets)), size_(size) {
  MEGATRON_CHECK(datasets_.size() == weights.size(), "blend of ", datasets_.size(), " datasets has ", weights.size(),
                 " weights");
  weights_ = numpy_normalize(numpy_normalize(weights));  // the builder normalises, then BlendedDataset again

  PyJson::Array identifiers, weight_list;
  for (const GPTDataset* d : datasets_) identifiers.push_back(d->unique_identifiers());
  for (double w : weights_) weight_list.emplace_back(w);
  // Megatron's unique_identifiers, in its order: class, datasets, split (the components' index split), weights, size.
  const char* split = split_name(datasets_.front()->split());
  for (const GPTDataset* d : datasets_)
    MEGATRON_CHECK(d->split() == datasets_.front()->split(), "a blend mixes the ", split, " and ",
                   split_name(d->split()), " splits of its datasets");
  PyJson description = PyJson::Object{{"class", "BlendedDataset"},
                                      {"datasets", identifiers},
                                      {"split", split},
                                      {"weights", weight_list},
                                      {"size", size_}};
  unique_description_ = description.dumps(4);
  unique_description_hash_ = md5_hex(unique_description_);

  std::filesystem::path dataset_index_path, sample_index_path, description_path;
  if (path_to_cache) {
    auto file = [&](const char* affix) {
      return std::filesystem::path(*path_to_cache) / str_cat(unique_description_hash_, "-BlendedDataset-", split, "-", affix);
    };
    description_path = file("description.txt");
    dataset_index_path = file("dataset_index.npy");
    sample_index_path = file("dataset_sample_index.npy");
  }
  const bool hit = path_to_cache && std::filesystem::is_regular_file(description_path) &&
                   std::filesystem::is_regular_file(dataset_index_path) &&
                   std::filesystem::is_regular_file(sample_index_path);
  if (hit) {
    auto ids = load_npy(dataset_index_path).to_int64(dataset_index_path);
    indices_.dataset_index.assign(ids.begin(), ids.end());
    indices_.dataset_sample_index = load_npy(sample_index_path).to_int64(sample_index_path);
    MEGATRON_CHECK(static_cast<int64_t>(indices_.dataset_index.size()) == size_ &&
                       static_cast<int64_t>(indices_.dataset_sample_index.size()) == size_,
                   dataset_index_path.string(), ": cached blend has ", indices_.dataset_index.size(),
                   " entries, expected ", size_);
  } else {
    MEGATRON_CHECK(!path_to_cache || may_build_cache, description_path.string(),
                   ": blend cache missing and this process does not build it");
    indices_ = build_blending_indices(weights_, size_);
    if (path_to_cache) {
      std::filesystem::create_directories(*path_to_cache);
      const std::string suffix = ".tmp" + std::to_string(::getpid());
      const int64_t shape[] = {size_};
      save_npy(dataset_index_path.string() + suffix, std::span<const int16_t>(indices_.dataset_index), shape);
      std::filesystem::rename(dataset_index_path.string() + suffix, dataset_index_path);
      save_npy(sample_index_path.string() + suffix, std::span<const int64_t>(indices_.dataset_sample_index), shape);
      std::filesystem::rename(sample_index_path.string() + suffix, sample_index_path);
      {
        std::ofstream out(description_path.string() + suffix, std::ios::binary | std::ios::trunc);
        out << unique_description_;
        MEGATRON_CHECK(out.good(), description_path.string(), ": write failed");
      }
      std::filesystem::rename(description_path.string() + suffix, description_path);
    }
  }
  // Megatron checks only the last sample; check every component's high-water mark.
  std::vector<int64_t> needed(datasets_.size(), 0);
  for (int64_t i = 0; i < size_; ++i) {
    auto [d, s] = locate(i);
    needed[static_cast<size_t>(d)] = std::max(needed[static_cast<size_t>(d)], s + 1);
  }
  for (size_t d = 0; d < datasets_.size(); ++d)
    MEGATRON_CHECK(needed[d] <= datasets_[d]->size(), "blend component ", d, " (",
                   datasets_[d]->unique_description_hash(), ") has ", datasets_[d]->size(),
                   " samples but the blend of ", size_, " samples needs ", needed[d]);
}

std::pair<int, int64_t> BlendedDataset::locate(int64_t index) const {
  MEGATRON_CHECK(index >= 0 && index < size_, "blended sample ", index, " out of range [0, ", size_, ")");
  const int d = indices_.dataset_index[static_cast<size_t>(index)];
  MEGATRON_CHECK(d >= 0 && d < static_cast<int>(datasets_.size()), "blended sample ", index, " names dataset ", d,
                 " of ", datasets_.size());
  return {d, indices_.dataset_sample_index[static_cast<size_t>(index)]};
}

void BlendedDataset::sample(int64_t index, std::span<int64_t> tokens) const {
  auto [d, s] = locate(index);
  datasets_[static_cast<size_t>(d)]->sample(s, tokens);
}

}  // namespace megatron::data
