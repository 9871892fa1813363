// TikTokenizer: tiktoken's byte-level BPE over a ranks file, as tiktoken.Encoding.encode_ordinary:
// the regex cuts the text into pieces; a piece that is itself a token is that token, else its bytes merge
// by the rank of the concatenated bytes (lowest first, leftmost on ties; bpe_merge.h). Special tokens are
// never matched in the text (encode_ordinary); they only have ids.
//
// Ranks file formats: tiktoken's text format, one "base64(token bytes) rank" per line (gpt2.tiktoken,
// cl100k_base.tiktoken, Llama 3's tokenizer.model), or Megatron's JSON list of {"rank", "token_bytes"
// (base64), "token_str"}. Ids are the ranks (ranks must be unique; gaps are allowed).
// Special-token layout: see TokenizerConfig::tiktoken_num_special_tokens.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "megatron/data/tokenizers/regex.h"
#include "megatron/data/tokenizers/string_map.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

// Pre-tokenisation patterns by name: "v2"/"llama3"/"cl100k", "v1"/"gpt2", "qwen2"; anything else is a regex.
std::string tiktoken_pattern(const std::string& name_or_regex);

struct TikTokenOptions {
  std::string pattern = "v2";
  std::vector<std::string> special_tokens;  // empty: the defaults of the layout
  int64_t num_special_tokens = 0;           // > 0: Megatron's layout (specials first, ranks shifted)
  int64_t max_vocab = -1;                   // keep only ranks < max_vocab - offset (Megatron's --vocab-size)
};

class TikTokenizer final : public Tokenizer {
 public:
  TikTokenizer(const std::string& ranks_file, TikTokenOptions options);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  int32_t eod() const override { return eos_; }
  int32_t pad() const override { return pad_; }
  int32_t num_ranks() const { return static_cast<int32_t>(rank_bytes_.size()); }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  StringMap<int32_t> ranks_;            // token bytes -> rank
  std::vector<std::string> rank_bytes_;  // rank -> token bytes (empty for gaps)
  std::vector<std::string> specials_;   // by special index
  int32_t offset_ = 0;                  // id = rank + offset_
  int32_t first_special_id_ = 0;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
  std::unique_ptr<Regex> regex_;

  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace megatron::data
