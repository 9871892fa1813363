#include "megatron/data/tokenizers/tokenizer.h"

#include "megatron/core/error.h"
#include "megatron/data/tokenizers/gpt2_tokenizer.h"
#include "megatron/data/tokenizers/hf_tokenizer.h"
#include "megatron/data/tokenizers/null_tokenizer.h"
#include "megatron/data/tokenizers/sentencepiece_tokenizer.h"
#include "megatron/data/tokenizers/tiktoken.h"

namespace megatron::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& c) {
  const auto need = [&](const std::string& value, const char* flag) {
    MEGATRON_CHECK(!value.empty(), "--tokenizer-type ", c.type, " needs ", flag);
  };
  if (c.type == "GPT2BPETokenizer") {
    need(c.vocab_file, "--vocab-file (vocab.json)");
    need(c.merge_file, "--merge-file (merges.txt)");
    return std::make_unique<Gpt2BpeTokenizer>(c.vocab_file, c.merge_file);
  }
  if (c.type == "HuggingFaceTokenizer") {
    need(c.tokenizer_model, "--tokenizer-model (tokenizer.json or its folder)");
    return std::make_unique<HfTokenizer>(c.tokenizer_model);
  }
  if (c.type == "TikTokenizer") {
    need(c.tokenizer_model, "--tokenizer-model (a tiktoken ranks file)");
    TikTokenOptions options;
    options.pattern = c.tiktoken_pattern;
    options.special_tokens = c.tiktoken_special_tokens;
    options.num_special_tokens = c.tiktoken_num_special_tokens;
    options.max_vocab = c.vocab_size.value_or(-1);
    return std::make_unique<TikTokenizer>(c.tokenizer_model, std::move(options));
  }
  if (c.type == "SentencePieceTokenizer" || c.type == "GPTSentencePieceTokenizer") {
    need(c.tokenizer_model, "--tokenizer-model (a sentencepiece .model)");
    return std::make_unique<SentencePieceTokenizer>(c.tokenizer_model);
  }
  if (c.type == "NullTokenizer") {
    MEGATRON_CHECK(c.vocab_size.has_value(), "--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*c.vocab_size);
  }
  MEGATRON_FAIL("unknown --tokenizer-type \"", c.type,
                "\" (supported: GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer, "
                "GPTSentencePieceTokenizer, NullTokenizer)");
}

}  // namespace megatron::data
