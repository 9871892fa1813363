#include "megatron/data/tokenizers/tokenizer.h"

#include <array>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/families.h"
#include "megatron/data/tokenizers/null_tokenizer.h"

// CMake defines, for each optional family, MEGATRON_TOKENIZERS_<FAMILY> (1 when built) and
// MEGATRON_TOKENIZERS_<FAMILY>_MISSING (what the build lacks otherwise, e.g. "no PCRE2 (install ...)").
#if MEGATRON_TOKENIZERS_REGEX
#define MEGATRON_REGEX_MAKER &detail::make_regex_tokenizer
#else
#define MEGATRON_REGEX_MAKER nullptr
#endif
#if MEGATRON_TOKENIZERS_SENTENCEPIECE
#define MEGATRON_SENTENCEPIECE_MAKER &detail::make_sentencepiece_tokenizer
#else
#define MEGATRON_SENTENCEPIECE_MAKER nullptr
#endif

namespace megatron::data {
namespace {

struct Family {
  std::array<std::string_view, 5> types;  // its --tokenizer-type names ("" pads)
  std::unique_ptr<Tokenizer> (*make)(const TokenizerConfig&);  // nullptr: not in this build
  const char* missing;
};

constexpr Family kFamilies[] = {
    {{"GPT2BPETokenizer", "HuggingFaceTokenizer", "SFTTokenizer", "TikTokenizer", "Llama3Tokenizer"}, MEGATRON_REGEX_MAKER,
     MEGATRON_TOKENIZERS_REGEX_MISSING},
    {{"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer", "", ""}, MEGATRON_SENTENCEPIECE_MAKER,
     MEGATRON_TOKENIZERS_SENTENCEPIECE_MISSING},
};

const Family* family_of(std::string_view type) {
  for (const Family& f : kFamilies)
    for (std::string_view t : f.types)
      if (!t.empty() && t == type) return &f;
  return nullptr;
}

}  // namespace

bool tokenizer_available(std::string_view type) {
  if (type == "NullTokenizer") return true;
  const Family* f = family_of(type);
  return f != nullptr && f->make != nullptr;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& c) {
  if (c.type == "NullTokenizer") {
    MEGATRON_CHECK(c.vocab_size.has_value(), "--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*c.vocab_size);
  }
  if (const Family* f = family_of(c.type)) {
    MEGATRON_CHECK(f->make != nullptr, "--tokenizer-type ", c.type, ": this build has ", f->missing);
    return f->make(c);
  }
  MEGATRON_FAIL("unknown --tokenizer-type ", quoted_bytes(c.type),
                " (supported: GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, Llama3Tokenizer, "
                "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, NullTokenizer)");
}

}  // namespace megatron::data
