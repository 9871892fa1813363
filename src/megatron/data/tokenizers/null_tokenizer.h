// NullTokenizer (Megatron's, for tests and pre-tokenised data): the text is whitespace-separated decimal
// integers and those are the ids; decode joins them with single spaces. vocab_size = the given size + 1,
// eod = the given size (Megatron: the extra id past the ids in use). A word that is not an integer in
// [0, vocab_size) is an error naming it.
#pragma once

#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return size_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(size_); }
  int32_t eos() const override { return static_cast<int32_t>(size_); }

 private:
  int64_t size_;
};

}  // namespace megatron::data
