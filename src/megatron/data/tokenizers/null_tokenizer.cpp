#include "megatron/data/tokenizers/null_tokenizer.h"

#include <charconv>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::data {

NullTokenizer::NullTokenizer(int64_t vocab_size) : size_(vocab_size) {
  MEGATRON_CHECK(vocab_size > 0 && vocab_size < INT32_MAX, "NullTokenizer: --vocab-size must be in [1, 2^31-1), got ",
                 vocab_size);
}

std::vector<int32_t> NullTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t i = 0;
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (i < text.size()) {
    while (i < text.size() && space(text[i])) ++i;
    const size_t begin = i;
    while (i < text.size() && !space(text[i])) ++i;
    if (i == begin) break;
    const std::string_view word = text.substr(begin, i - begin);
    int64_t value = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    MEGATRON_CHECK(ec == std::errc() && end == word.data() + word.size() && value >= 0 && value <= size_,
                   "NullTokenizer: ", quoted_bytes(word), " at byte ", begin, " is not an id in [0, ", size_ + 1, ")");
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

std::string NullTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace megatron::data
