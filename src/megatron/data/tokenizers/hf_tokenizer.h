// HuggingFaceTokenizer: a tokenizer.json of HF tokenizers with a BPE model, run as tokenizers'
// Tokenizer.encode(text, add_special_tokens=False):
//   raw text -> added tokens (normalized=false) cut out -> each remaining piece normalised -> added tokens
//   (normalized=true) cut out -> pre-tokenizer -> BPE per piece.
// decode(ids) is Tokenizer.decode(ids, skip_special_tokens=False) (see decoder.h for the ill-formed bytes rule).
// Special ids: from tokenizer_config.json next to tokenizer.json when present (bos_token, eos_token,
// pad_token), else by well-known names (<|begin_of_text|>, <s>; <|end_of_text|>, <|endoftext|>, </s>;
// <pad>, <|pad|>). eod = eos, as Megatron's _HuggingFaceTokenizer.
// Not supported (refused at load with the JSON path): models other than BPE, BPE dropout.
// The post_processor is not applied: Megatron's preprocess_data appends eod itself.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "megatron/data/tokenizers/added_vocab.h"
#include "megatron/data/tokenizers/bpe.h"
#include "megatron/data/tokenizers/decoder.h"
#include "megatron/data/tokenizers/normalizer.h"
#include "megatron/data/tokenizers/pretokenizer.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json file or a folder holding one.
  explicit HfTokenizer(const std::string& path);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  int32_t pad() const override { return pad_; }
  // -1 when absent (added tokens included).
  int32_t token_to_id(std::string_view token) const;

 private:
  void encode_plain(std::string text, bool at_start, std::vector<int32_t>& ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  StringMap<int32_t> added_ids_;
  std::unordered_map<int32_t, std::string> added_by_id_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;         // normalized == false
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;  // normalized == true
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
};

}  // namespace megatron::data
