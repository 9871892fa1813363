#include "megatron/trainer/batches.h"

#include <cmath>

#include "megatron/core/error.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/mock_gpt_dataset.h"

namespace megatron::trainer {

Tensor SampleStream::next(int64_t n, Allocator& host) { return next(n, host, 0, n); }

Tensor SampleStream::next(int64_t n, Allocator& host, int64_t begin, int64_t count) {
  MEGATRON_CHECK(available(), "no samples in this split");
  MEGATRON_CHECK(0 <= begin && begin + count <= n, "SampleStream::next: rows [", begin, ", ", begin + count,
                 ") of a step of ", n, " samples");
  Tensor out = Tensor::empty(Shape{count, width_}, DType::I64, host);
  int64_t* p = out.data<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    read_((consumed_ + begin + i) % size_, std::span<int64_t>(p + i * width_, size_t(width_)));
  consumed_ += n;
  return out;
}

std::pair<std::vector<double>, std::vector<std::string>> parse_data_path(const std::vector<std::string>& values) {
  auto is_number = [](const std::string& s) {
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
  };
  bool weighted = !values.empty() && is_number(values[0]);
  std::vector<double> weights;
  std::vector<std::string> prefixes;
  if (!weighted) {
    for (const auto& v : values) {
      MEGATRON_CHECK(!is_number(v), "--data-path: '", v, "' looks like a weight, but the first value was a prefix; "
                                    "give either 'prefix...' or 'weight prefix ...' pairs");
      prefixes.push_back(v);
    }
    return {weights, prefixes};
  }
  MEGATRON_CHECK(values.size() % 2 == 0, "--data-path: weighted form needs 'weight prefix' pairs, got ", values.size(),
                 " values");
  for (size_t i = 0; i < values.size(); i += 2) {
    MEGATRON_CHECK(is_number(values[i]) && !is_number(values[i + 1]), "--data-path: expected 'weight prefix' at values ",
                   i, " and ", i + 1, ", got '", values[i], "' '", values[i + 1], "'");
    double w = std::strtod(values[i].c_str(), nullptr);
    MEGATRON_CHECK(w > 0, "--data-path: weight ", values[i], " of ", values[i + 1], " must be positive");
    weights.push_back(w);
    prefixes.push_back(values[i + 1]);
  }
  return {weights, prefixes};
}

TrainingData::TrainingData(const train::Arguments& args, int64_t eod_token) {
  const auto& t = args.training;
  const int64_t gbs = t.global_batch_size;
  const int64_t eval_runs = t.eval_interval > 0 ? t.train_iters / t.eval_interval + 1 : 0;
  // Megatron's get_train_valid_test_num_samples: --train-samples when training counts samples.
  const int64_t train_samples = t.iterations_from_samples ? t.train_samples : t.train_iters * gbs;
  const std::array<int64_t, data::kNumSplits> targets = {train_samples, eval_runs * t.eval_iters * gbs,
                                                         t.eval_iters * gbs};
  data::GPTDatasetConfig config;
  config.random_seed = uint64_t(t.seed);
  config.sequence_length = args.model.seq_length;
  config.split = args.data.split;
  if (!args.data.data_cache_path.empty()) config.path_to_cache = args.data.data_cache_path;

  if (args.data.mock_data) {
    auto mock = std::make_unique<data::MockGPTLowLevelDataset>(eod_token);
    components_.push_back(data::build_mock_gpt_datasets(*mock, {targets[0], targets[1], targets[2]}, config));
    sources_.push_back(std::move(mock));
    names_.push_back("mock data");
    return;
  }
  auto [weights, prefixes] = parse_data_path(args.data.data_path);
  names_ = prefixes;
  if (prefixes.size() == 1) {
    sources_.push_back(std::make_unique<data::IndexedDatasetReader>(prefixes[0]));
    components_.push_back(
        data::build_gpt_dataset_splits(*sources_[0], prefixes[0], {targets[0], targets[1], targets[2]}, config));
    return;
  }
  // Blend: normalise the weights; each component is asked for ceil(ceil(S * w) * 1.005) samples per split
  // (Megatron's mid-level surplus), the blend holds sum(ceil(S * w)). Without weights, Megatron weighs the
  // components by their sizes: build them for one epoch first and use their sample counts.
  for (const auto& p : prefixes) sources_.push_back(std::make_unique<data::IndexedDatasetReader>(p));
  if (weights.empty()) {
    for (size_t c = 0; c < prefixes.size(); ++c) {
      auto one_epoch = data::build_gpt_dataset_splits(*sources_[c], prefixes[c], {std::nullopt, std::nullopt, std::nullopt},
                                                      config);
      weights.push_back(one_epoch[0] ? double(one_epoch[0]->size()) : 0.0);
    }
  }
  weights_ = weights;
  double total = 0;
  for (double w : weights) total += w;
  std::vector<double> normalized;
  for (double w : weights) normalized.push_back(w / total);
  components_.resize(prefixes.size());
  std::array<std::vector<int64_t>, data::kNumSplits> sizes;
  for (int s = 0; s < data::kNumSplits; ++s)
    sizes[s] = data::blend_sizes_per_dataset(normalized, targets[s], data::kMidLevelDatasetSurplus);
  for (size_t c = 0; c < prefixes.size(); ++c)
    components_[c] = data::build_gpt_dataset_splits(*sources_[c], prefixes[c],
                                                    {sizes[0][c], sizes[1][c], sizes[2][c]}, config);
  for (int s = 0; s < data::kNumSplits; ++s) {
    if (targets[s] == 0) continue;
    std::vector<const data::GPTDataset*> parts;
    std::vector<double> part_weights;
    for (size_t c = 0; c < prefixes.size(); ++c) {
      MEGATRON_CHECK(components_[c][s].has_value(), "--data-path: ", prefixes[c], " has no documents in split ", s,
                     " (--split ", args.data.split, ") but the blend asks for samples of it");
      parts.push_back(&*components_[c][s]);
      part_weights.push_back(normalized[c]);
    }
    int64_t blend_size = 0;
    for (double w : normalized) blend_size += int64_t(std::ceil(double(targets[s]) * w));
    blends_[s].emplace(parts, part_weights, blend_size, config.path_to_cache);
  }
}

SampleStream TrainingData::stream(data::Split split) const {
  const size_t s = size_t(split);
  if (blends_[s]) {
    const data::BlendedDataset* b = &*blends_[s];
    return SampleStream([b](int64_t i, std::span<int64_t> out) { b->sample(i, out); }, b->size(),
                        int64_t(components_[0][s]->sample_tokens()));
  }
  if (components_.size() == 1 && components_[0][s]) {
    const data::GPTDataset* d = &*components_[0][s];
    return SampleStream([d](int64_t i, std::span<int64_t> out) { d->sample(i, out); }, d->size(), d->sample_tokens());
  }
  return SampleStream();
}

std::string TrainingData::describe() const {
  static const char* split_names[] = {"train", "valid", "test"};
  std::string s;
  for (int i = 0; i < data::kNumSplits; ++i) {
    SampleStream stream = this->stream(data::Split(i));
    s += str_cat("  ", split_names[i], ": ", stream.size(), " samples");
    if (blends_[i]) {
      s += " blended from";
      for (size_t c = 0; c < names_.size(); ++c) s += str_cat(" ", names_[c], " (weight ", blends_[i]->weights()[c], ")");
    } else if (!names_.empty()) {
      s += " of " + names_[0];
    }
    s += "\n";
  }
  return s;
}

}  // namespace megatron::trainer
