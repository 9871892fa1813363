// The optional tokenizer families behind make_tokenizer (tokenizer.h). Each is compiled only when CMake
// found its dependencies (CMakeLists.txt here); tokenizer.cpp calls a family's maker only in builds that
// have it, and otherwise reports what the build lacks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data::detail {

// GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer (regex_family.cpp: PCRE2 and nlohmann_json).
std::unique_ptr<Tokenizer> make_regex_tokenizer(const TokenizerConfig& config);
// Llama 3's special tokens in id order (256, after its 128000 ranks), for Llama3Tokenizer.
std::vector<std::string> llama3_special_tokens();
// SentencePieceTokenizer, GPTSentencePieceTokenizer (sentencepiece_tokenizer.cpp: libsentencepiece).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerConfig& config);

// Throws "--tokenizer-type <type> needs <flag>" when the flag's value is empty.
inline void require_flag(const TokenizerConfig& config, const std::string& value, const char* flag) {
  MEGATRON_CHECK(!value.empty(), "--tokenizer-type ", config.type, " needs ", flag);
}

}  // namespace megatron::data::detail
