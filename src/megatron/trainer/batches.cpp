#include "megatron/trainer/batches.h"

#include "megatron/core/error.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/mock_gpt_dataset.h"

namespace megatron::trainer {

Tensor SampleStream::next(int64_t n, Allocator& host) {
  MEGATRON_CHECK(available(), "no samples in this split");
  const int64_t width = dataset_->sample_tokens();
  Tensor out = Tensor::empty(Shape{n, width}, DType::I64, host);
  int64_t* p = out.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    dataset_->sample(consumed_ % dataset_->size(), std::span<int64_t>(p + i * width, size_t(width)));
    ++consumed_;
  }
  return out;
}

TrainingData::TrainingData(const train::Arguments& args, int64_t eod_token) {
  const auto& t = args.training;
  const int64_t gbs = t.global_batch_size;
  const int64_t eval_runs = t.eval_interval > 0 ? t.train_iters / t.eval_interval + 1 : 0;
  std::array<std::optional<int64_t>, data::kNumSplits> sizes = {t.train_iters * gbs, eval_runs * t.eval_iters * gbs,
                                                                t.eval_iters * gbs};
  data::GPTDatasetConfig config;
  config.random_seed = uint64_t(t.seed);
  config.sequence_length = args.model.seq_length;
  config.split = args.data.split;
  if (!args.data.data_cache_path.empty()) config.path_to_cache = args.data.data_cache_path;
  if (args.data.mock_data) {
    auto mock = std::make_unique<data::MockGPTLowLevelDataset>(eod_token);
    splits_ = data::build_mock_gpt_datasets(*mock, sizes, config);
    source_ = std::move(mock);
    source_name_ = "mock data";
    return;
  }
  const auto& paths = args.data.data_path;
  MEGATRON_CHECK(paths.size() == 1,
                 "--data-path: blending several datasets (", paths.size(),
                 " values given) is not wired into training yet; give one prefix");
  auto reader = std::make_unique<data::IndexedDatasetReader>(paths[0]);
  splits_ = data::build_gpt_dataset_splits(*reader, paths[0], sizes, config);
  source_ = std::move(reader);
  source_name_ = paths[0];
}

SampleStream TrainingData::stream(data::Split split) const {
  const auto& d = splits_[size_t(split)];
  return SampleStream(d ? &*d : nullptr);
}

std::string TrainingData::describe() const {
  static const char* names[] = {"train", "valid", "test"};
  std::string s;
  for (int i = 0; i < data::kNumSplits; ++i)
    s += str_cat("  ", names[i], ": ", splits_[i] ? splits_[i]->size() : 0, " samples of ", source_name_, "\n");
  return s;
}

}  // namespace megatron::trainer
