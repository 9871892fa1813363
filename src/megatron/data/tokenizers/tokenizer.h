// The tokenizer interface and the factory for Megatron's --tokenizer-type names.
//
// Contract:
// - encode(text) takes any bytes. Ill-formed UTF-8 is first replaced by U+FFFD exactly as Python's
//   bytes.decode("utf-8", errors="replace") does (utf8.h): the canonical implementations take Python str, so
//   this is what they see for the same bytes. encode never adds BOS/EOS; the caller appends eod() itself
//   (preprocess_data --append-eod), as Megatron does.
// - decode(ids) returns the bytes the ids stand for (which may be ill-formed UTF-8 for a partial sequence);
//   for every tokenizer here decode(encode(x)) == sanitize_utf8(x) (SentencePiece: up to its normalisation).
// - Special ids are -1 when the tokenizer has no such token.
// - encode/decode are thread-safe (const; caches are internally locked).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const { return eos(); }
  virtual int32_t bos() const { return -1; }
  virtual int32_t eos() const { return -1; }
  virtual int32_t pad() const { return -1; }
};

// Megatron's tokenizer flags (--tokenizer-type, --vocab-file, --merge-file, --tokenizer-model, --vocab-size,
// --tiktoken-pattern, --tiktoken-num-special-tokens, --tiktoken-special-tokens).
struct TokenizerConfig {
  std::string type;             // GPT2BPETokenizer, HuggingFaceTokenizer (SFTTokenizer: the same), TikTokenizer,
                                // SentencePieceTokenizer, GPTSentencePieceTokenizer, NullTokenizer
  std::string vocab_file{};       // GPT2BPETokenizer: vocab.json
  std::string merge_file{};       // GPT2BPETokenizer: merges.txt
  std::string tokenizer_model{};  // HF: tokenizer.json (or its folder); TikToken: ranks file; SentencePiece: .model
  std::optional<int64_t> vocab_size{};  // NullTokenizer (required); TikTokenizer: cap on the ranks kept
  // TikTokenizer: "v2"/"llama3"/"cl100k" (default), "v1"/"gpt2", "qwen2", or a regex.
  std::string tiktoken_pattern = "v2";
  // TikTokenizer special tokens. 0 (default): `tiktoken_special_tokens` (default <|begin_of_text|>,
  // <|end_of_text|>) get ids after the ranks. N > 0: Megatron's layout: the special tokens (default <unk>, <s>,
  // </s>), padded with <SPECIAL_i> to N, take ids 0..N-1 and every rank is shifted by N.
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> tiktoken_special_tokens{};
};

// Builds the tokenizer; errors name the flag or file at fault, or, for a type this build does not have, what
// it lacks ("--tokenizer-type GPT2BPETokenizer: this build has no PCRE2 (install libpcre2-dev and
// reconfigure)").
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& config);

// Whether make_tokenizer can build `type` here. NullTokenizer always can; GPT2BPETokenizer,
// HuggingFaceTokenizer and TikTokenizer need PCRE2 and nlohmann_json at configure time, SentencePieceTokenizer
// and GPTSentencePieceTokenizer libsentencepiece (src/megatron/data/tokenizers/CMakeLists.txt).
bool tokenizer_available(std::string_view type);

}  // namespace megatron::data
