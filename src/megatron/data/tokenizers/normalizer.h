// tokenizer.json normalizers (HF tokenizers' `normalizer` field), applied to each piece of text between added
// tokens. Supported: Sequence, NFC, NFD, NFKC, NFKD (need ICU), Lowercase (ICU), Replace (String or Regex
// pattern), Prepend (not on empty text), Strip. Anything else is refused at load time with the JSON path.
#pragma once

#include <memory>
#include <string>

#include "megatron/data/tokenizers/json_util.h"

namespace megatron::data {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};

// nullptr for a JSON null.
std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const JsonWhere& where);

// The literal string or compiled regex of a {"String": s} / {"Regex": r} pattern object.
struct PatternSpec {
  std::string regex;  // a regex either way (literal strings escaped)
};
PatternSpec parse_pattern(const Json& j, const JsonWhere& where);

}  // namespace megatron::data
