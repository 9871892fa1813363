// Megatron's left-to-right masks and position ids of one GPT sample, with its document flags
// (megatron/core/datasets/gpt_dataset.py: _get_ltor_masks_and_position_ids, then GPTDataset.__getitem__'s
// padding rules), for the sample's s input tokens (its first s of s + 1 tokens; labels are the next ones):
//   loss_mask[i] = 0 where tokens[i] is the end-of-document token and --eod-mask-loss is on (no loss on
//                  predicting a new document from the EOD), and where labels[i] is the pad id (-1: the
//                  padding of a kept last partial sample); 1 elsewhere;
//   position_ids[i] = i, or with --reset-position-ids the distance from the token after the last EOD
//                  before i (the token after an EOD is at position 0);
//   attention: query i sees key j <= i; with --reset-attention-mask only if no EOD lies in [j, i - 1],
//                  i.e. a document is the tokens up to and including its EOD, and the next starts after it.
//                  Described by the documents' boundaries (cumulative lengths, cu_seqlens): {0, e_1 + 1,
//                  e_2 + 1, ..., s} for the EODs e_k < s - 1; {0, s} without the flag.
// Padding (-1) in tokens and labels becomes token 0 (Megatron maps it so the embedding can read it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace megatron::data {

// Megatron's GPTDataset pad id when the tokenizer has none (the padding of a kept last partial sample).
inline constexpr int64_t kPadTokenId = -1;

struct DocumentFlags {
  bool reset_position_ids = false;    // --reset-position-ids
  bool reset_attention_mask = false;  // --reset-attention-mask
  bool eod_mask_loss = false;         // --eod-mask-loss
  bool any() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
};

struct SampleMasks {
  std::vector<int64_t> tokens, labels;  // padding mapped to 0
  std::vector<float> loss_mask;
  std::vector<int64_t> position_ids;
  std::vector<int64_t> document_offsets;  // cu_seqlens of the sample's documents: 0 first, s last
};

// `sample`: the s + 1 tokens of one sample (inputs and the shifted labels).
SampleMasks ltor_masks_and_position_ids(std::span<const int64_t> sample, int64_t eod, const DocumentFlags& flags);

// Whether query i may attend key j under the document boundaries `offsets` (a cu_seqlens as above).
bool attends(std::span<const int64_t> offsets, int64_t query, int64_t key);

}  // namespace megatron::data
