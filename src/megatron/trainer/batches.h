// Where training and validation samples come from: Megatron's GPTDataset over --data-path (one prefix for
// now) or the mock dataset (--mock-data), with Megatron's sample counts per split
// (train = train_iters * GBS; valid = (train_iters // eval_interval + 1) * eval_iters * GBS; test = eval_iters * GBS).
//
// A SampleStream hands out consecutive samples of one split as a host I64 tensor [n, seq_len + 1] and
// counts what it consumed (what a resume needs). Samples are read in Megatron's order.
#pragma once

#include <array>
#include <memory>
#include <optional>

#include "megatron/data/gpt_dataset.h"
#include "megatron/runtime/context.h"
#include "megatron/train/arguments.h"

namespace megatron::trainer {

class SampleStream {
 public:
  explicit SampleStream(const data::GPTDataset* dataset) : dataset_(dataset) {}
  bool available() const { return dataset_ != nullptr && dataset_->size() > 0; }
  // The next n samples (wrapping around the split); `host` is the CPU allocator for the result.
  Tensor next(int64_t n, Allocator& host);
  int64_t consumed() const { return consumed_; }
  void rewind() { consumed_ = 0; }

 private:
  const data::GPTDataset* dataset_;
  int64_t consumed_ = 0;
};

// Owns the low-level dataset and the three splits. vocab_size / eod come from the tokenizer or --vocab-size.
class TrainingData {
 public:
  TrainingData(const train::Arguments& args, int64_t eod_token);
  SampleStream stream(data::Split split) const;
  std::string describe() const;  // one line per split: samples and source

 private:
  std::unique_ptr<data::TokenSequences> source_;
  std::array<std::optional<data::GPTDataset>, data::kNumSplits> splits_;
  std::string source_name_;
};

}  // namespace megatron::trainer
