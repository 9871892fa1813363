// tokenizer.json pre-tokenizers (HF tokenizers' `pre_tokenizer` field): they cut normalised text into the
// pieces the model encodes one by one. Supported: Sequence, Split (String/Regex pattern, behaviours Removed,
// Isolated, MergedWithPrevious, MergedWithNext, Contiguous, invert), ByteLevel (add_prefix_space, use_regex
// with GPT-2's pattern; maps bytes to the byte-level alphabet), Digits, Metaspace (replacement,
// prepend_scheme always/first/never or the older add_prefix_space, split), Whitespace, WhitespaceSplit.
// Empty pieces are dropped, as HF does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/data/tokenizers/json_util.h"

namespace megatron::data {

struct PreToken {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<PreToken>& pieces) const = 0;
};

// nullptr for a JSON null.
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const JsonWhere& where);

}  // namespace megatron::data
