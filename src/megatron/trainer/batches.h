// Where training and validation samples come from: Megatron's GPTDataset over --data-path, blended
// (BlendedDataset) when several prefixes are given ("0.7 A 0.3 B", or "A B" weighted by the components'
// sizes), or the mock dataset (--mock-data), with Megatron's sample counts per split
// (train = train_iters * GBS, or --train-samples; valid = (train_iters // eval_interval + 1) * eval_iters * GBS; test = eval_iters * GBS).
//
// A SampleStream hands out consecutive samples of one split as a host I64 tensor [n, seq_len + 1] and
// counts what it consumed (what a resume needs). Samples are read in Megatron's order.
#pragma once

#include <array>
#include <memory>
#include <optional>

#include <functional>
#include <span>
#include <vector>

#include "megatron/data/blended_dataset.h"
#include "megatron/data/gpt_dataset.h"
#include "megatron/runtime/context.h"
#include "megatron/train/arguments.h"

namespace megatron::trainer {

class SampleStream {
 public:
  using Reader = std::function<void(int64_t index, std::span<int64_t> tokens)>;
  SampleStream() = default;
  SampleStream(Reader read, int64_t size, int64_t width) : read_(std::move(read)), size_(size), width_(width) {}
  bool available() const { return read_ && size_ > 0; }
  int64_t size() const { return size_; }
  // The next n samples (wrapping around the split); `host` is the CPU allocator for the result.
  Tensor next(int64_t n, Allocator& host);
  // Consumes the next n samples but reads only rows [begin, begin + count) of them (a data-parallel
  // rank's micro-batch of a step of n = mbs * DP samples).
  Tensor next(int64_t n, Allocator& host, int64_t begin, int64_t count);
  // Consumes the next n samples without reading them (a pipeline rank with neither the first nor the last
  // stage keeps the data position without reading data).
  void skip(int64_t n) { consumed_ += n; }
  int64_t consumed() const { return consumed_; }
  void rewind() { consumed_ = 0; }
  void set_consumed(int64_t n) { consumed_ = n; }  // resuming from a checkpoint

 private:
  Reader read_;
  int64_t size_ = 0, width_ = 0;
  int64_t consumed_ = 0;
};

// Owns the low-level dataset and the three splits. vocab_size / eod come from the tokenizer or --vocab-size.
class TrainingData {
 public:
  TrainingData(const train::Arguments& args, int64_t eod_token);
  SampleStream stream(data::Split split) const;
  std::string describe() const;  // one line per split: samples and source

 private:
  // One component per --data-path prefix (one for mock data); blends_ only with several components.
  std::vector<std::unique_ptr<data::TokenSequences>> sources_;
  std::vector<std::array<std::optional<data::GPTDataset>, data::kNumSplits>> components_;
  std::array<std::optional<data::BlendedDataset>, data::kNumSplits> blends_;
  std::vector<std::string> names_;
  std::vector<double> weights_;
};

// "--data-path 0.7 A 0.3 B" -> {(0.7, A), (0.3, B)}; "A B" -> weights empty. Mixed forms are an error.
std::pair<std::vector<double>, std::vector<std::string>> parse_data_path(const std::vector<std::string>& values);

}  // namespace megatron::trainer
