// Added tokens of a tokenizer.json (`added_tokens`): strings matched in the text before the model sees it,
// each becoming its fixed id. As HF tokenizers: tokens with normalized=false are matched in the raw text,
// those with normalized=true in each normalised piece; matching is leftmost-longest and non-overlapping;
// lstrip/rstrip absorb the whitespace before/after a match; a single_word token only matches between
// non-word characters (word = ASCII alphanumeric, '_' or any non-ASCII character: an approximation).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/data/tokenizers/regex.h"

namespace megatron::data {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

struct AddedSplit {
  Span span;
  int32_t id;  // the added token's id, -1 for plain text
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Cuts `text` into plain spans and added-token spans covering it in order (empty plain spans left out).
  std::vector<AddedSplit> split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;                  // longest first
  std::vector<std::vector<int32_t>> by_first_byte_;  // first byte -> indices into tokens_, longest first
};

}  // namespace megatron::data
