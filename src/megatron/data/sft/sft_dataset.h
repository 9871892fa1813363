// Megatron's SFT dataset (--sft): jsonl conversations tokenised with a chat format (chat_format.h) and packed
// into rows of --seq-length + 1 tokens (sft_packing.h).
//
// A line of the jsonl is a JSON object with either
//   "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]   (Megatron's form;
//               a new "system" message starts a new conversation, so one line may hold several), or
//   "prompt" and "response" strings (optionally "system"): one conversation system?, user, assistant.
// Errors name the file, the line number and what is wrong.
//
// Splits: --split divides the lines as Megatron divides documents (dataset_split.h); each split packs its own
// lines. A split's samples are its packed rows in order; reading past the end wraps around (Megatron's
// SFTDataset reads line idx % lines, without shuffling).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "megatron/data/dataset_split.h"
#include "megatron/data/sft/sft_packing.h"

namespace megatron::data {

// The conversations of each line of `path`, in order (a line may give several).
std::vector<std::vector<std::vector<ChatMessage>>> read_sft_jsonl(const std::string& path);

class SftDataset {
 public:
  SftDataset(PackedConversations rows, int64_t conversations) : rows_(std::move(rows)), conversations_(conversations) {}
  int64_t size() const { return rows_.rows(); }
  int64_t row_width() const { return rows_.row_width; }
  int64_t conversations() const { return conversations_; }
  int64_t truncated() const { return rows_.truncated; }
  // Row `index` (taken modulo size()) into `out` (row_width() values).
  void sample(int64_t index, std::span<int64_t> out) const;

 private:
  PackedConversations rows_;
  int64_t conversations_ = 0;
};

struct SftDatasetConfig {
  std::string path;         // the .jsonl (--data-path)
  std::string split = "969, 30, 1";
  int64_t seq_length = 0;
  ChatFormat format = ChatFormat::Llama3;
};

// The train/valid/test datasets; a split without lines is absent.
std::array<std::optional<SftDataset>, kNumSplits> build_sft_datasets(const SftDatasetConfig& config,
                                                                      const Tokenizer& tokenizer);

}  // namespace megatron::data
