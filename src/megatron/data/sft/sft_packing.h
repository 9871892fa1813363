// Packing tokenised conversations into training rows of --seq-length + 1 tokens (inputs plus the last label).
//
// Order (deterministic, no randomness): the conversations in file order, next-fit: a conversation goes into
// the current row when it fits in the row's remaining tokens, else the row is closed (its rest padded) and
// the conversation starts the next row. A conversation longer than a whole row is cut on the right to the
// row's length and fills a row alone (`truncated` counts them). Empty conversations are skipped.
//
// A packed row is 2 (S + 1) int64 values: the S + 1 tokens, then one tag per token:
//   tag = 2 * k + trained for the k-th conversation of the row (k from 0; trained = 1 on assistant targets),
//   tag = kPaddingTag for the padding after the last conversation (token = the pad id).
// The tags say everything a micro-batch needs: the documents (cu_seqlens), the positions inside each (from
// 0) and the loss mask (a label counts when its token is trained and belongs to the input's conversation).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/data/sft/chat_format.h"

namespace megatron::data {

inline constexpr int64_t kPaddingTag = -1;

struct PackedConversations {
  int64_t row_width = 0;         // 2 (S + 1)
  std::vector<int64_t> values;   // rows * row_width
  int64_t truncated = 0;         // conversations cut to a row
  int64_t rows() const { return row_width ? int64_t(values.size()) / row_width : 0; }
};

PackedConversations pack_conversations(const std::vector<ConversationTokens>& conversations, int64_t seq_length,
                                       int64_t pad_id);

}  // namespace megatron::data
