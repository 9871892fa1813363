#include "megatron/data/sft/sft_packing.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

// Fills the rest of the open row with padding and appends it.
void close_row(std::vector<int64_t>& tokens, std::vector<int64_t>& tags, int64_t capacity, int64_t pad_id,
               PackedConversations& out) {
  if (tokens.empty()) return;
  tokens.resize(size_t(capacity), pad_id);
  tags.resize(size_t(capacity), kPaddingTag);
  out.values.insert(out.values.end(), tokens.begin(), tokens.end());
  out.values.insert(out.values.end(), tags.begin(), tags.end());
  tokens.clear();
  tags.clear();
}

}  // namespace

PackedConversations pack_conversations(const std::vector<ConversationTokens>& conversations, int64_t seq_length,
                                       int64_t pad_id) {
  MEGATRON_CHECK(seq_length > 0, "pack_conversations: --seq-length must be positive, got ", seq_length);
  const int64_t capacity = seq_length + 1;
  PackedConversations out{.row_width = 2 * capacity};
  std::vector<int64_t> tokens, tags;
  int64_t document = 0;
  for (const ConversationTokens& c : conversations) {
    MEGATRON_CHECK(c.tokens.size() == c.trained.size(), "pack_conversations: ", c.tokens.size(), " tokens but ",
                   c.trained.size(), " loss flags");
    if (c.tokens.empty()) continue;
    int64_t length = int64_t(c.tokens.size());
    if (int64_t(tokens.size()) + length > capacity) {
      close_row(tokens, tags, capacity, pad_id, out);
      document = 0;
    }
    if (length > capacity) {
      length = capacity;
      ++out.truncated;
    }
    for (int64_t i = 0; i < length; ++i) {
      tokens.push_back(c.tokens[size_t(i)]);
      tags.push_back(2 * document + (c.trained[size_t(i)] ? 1 : 0));
    }
    ++document;
  }
  close_row(tokens, tags, capacity, pad_id, out);
  return out;
}

}  // namespace megatron::data
