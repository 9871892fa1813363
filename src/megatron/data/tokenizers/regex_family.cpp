// The PCRE2 family of make_tokenizer (families.h): GPT-2 BPE, Hugging Face tokenizer.json, tiktoken.
#include "megatron/data/tokenizers/families.h"
#include "megatron/data/tokenizers/gpt2_tokenizer.h"
#include "megatron/data/tokenizers/hf_tokenizer.h"
#include "megatron/data/tokenizers/tiktoken.h"

namespace megatron::data::detail {

// Llama 3.1's 256 special tokens, ids 128000-128255 after the 128000 ranks (Meta's tokenizer.py, also what
// transformers' tokenizer.json holds): <|begin_of_text|> 128000 (bos), <|end_of_text|> 128001 (eos, the
// end-of-document token), <|finetune_right_pad_id|> 128004, the chat headers, <|eot_id|> 128009; the rest are
// reserved. Llama 3.0 names some of the reserved slots differently, with the same ids.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> s = {"<|begin_of_text|>",         "<|end_of_text|>",         "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                                "<|start_header_id|>",       "<|end_header_id|>",       "<|eom_id|>",
                                "<|eot_id|>",                "<|python_tag|>"};
  for (int i = 3; s.size() < 256; ++i) s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return s;
}

std::unique_ptr<Tokenizer> make_regex_tokenizer(const TokenizerConfig& c) {
  if (c.type == "GPT2BPETokenizer") {
    require_flag(c, c.vocab_file, "--vocab-file (vocab.json)");
    require_flag(c, c.merge_file, "--merge-file (merges.txt)");
    return std::make_unique<Gpt2BpeTokenizer>(c.vocab_file, c.merge_file);
  }
  if (c.type == "HuggingFaceTokenizer") {
    require_flag(c, c.tokenizer_model, "--tokenizer-model (tokenizer.json or its folder)");
    return std::make_unique<HfTokenizer>(c.tokenizer_model);
  }
  if (c.type == "Llama3Tokenizer") {  // Llama 3's tokenizer.model: tiktoken ranks, Llama 3's pattern and specials
    require_flag(c, c.tokenizer_model, "--tokenizer-model (Llama 3's tokenizer.model, a tiktoken ranks file)");
    TikTokenOptions options;
    options.pattern = "llama3";
    options.special_tokens = llama3_special_tokens();
    options.max_vocab = c.vocab_size.value_or(-1);
    return std::make_unique<TikTokenizer>(c.tokenizer_model, std::move(options));
  }
  MEGATRON_CHECK(c.type == "TikTokenizer", "make_regex_tokenizer: --tokenizer-type ", c.type, " is not of this family");
  require_flag(c, c.tokenizer_model, "--tokenizer-model (a tiktoken ranks file)");
  TikTokenOptions options;
  options.pattern = c.tiktoken_pattern;
  options.special_tokens = c.tiktoken_special_tokens;
  options.num_special_tokens = c.tiktoken_num_special_tokens;
  options.max_vocab = c.vocab_size.value_or(-1);
  return std::make_unique<TikTokenizer>(c.tokenizer_model, std::move(options));
}

}  // namespace megatron::data::detail
