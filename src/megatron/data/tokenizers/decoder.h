// tokenizer.json decoders (HF tokenizers' `decoder` field): they turn the list of tokens of some ids back into
// text. Supported: Sequence, ByteLevel, Metaspace, Replace (String pattern), ByteFallback, Fuse, Strip.
// Without a decoder the tokens are joined with spaces (as HF). Deviation, on purpose: where HF would make a
// Python str with U+FFFD for ill-formed bytes (ByteLevel, ByteFallback), we keep the bytes (a caller decoding
// a whole sequence gets the same text; one decoding a prefix can still join the bytes later).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/data/tokenizers/json_util.h"

namespace megatron::data {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: rewrites the token list in place.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null.
std::unique_ptr<Decoder> parse_decoder(const Json& j, const JsonWhere& where);

}  // namespace megatron::data
