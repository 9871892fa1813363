// GPT2BPETokenizer: GPT-2's vocab.json + merges.txt, byte-level BPE after GPT-2's regex pre-tokenisation
// (OpenAI's encoder.py, as Megatron's gpt2_tokenization.py). Text that spells a special token is encoded
// as plain text, as there. eod = <|endoftext|> (-1 when the vocabulary lacks it).
#pragma once

#include <memory>
#include <string>

#include "megatron/data/tokenizers/bpe.h"
#include "megatron/data/tokenizers/byte_level.h"
#include "megatron/data/tokenizers/regex.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

// GPT-2's pre-tokenisation pattern (also HF's ByteLevel pre-tokenizer with use_regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return bpe_->size(); }
  int32_t eod() const override { return eod_; }
  int32_t eos() const override { return eod_; }

 private:
  std::unique_ptr<BpeModel> bpe_;
  ByteLevelAlphabet alphabet_;
  Regex regex_{kGpt2Pattern, "GPT-2 pattern"};
  int32_t eod_ = -1;
};

}  // namespace megatron::data
