// The part of the tokenizer fuzz targets that follows loading: a tokenizer built from fuzzed files must
// encode any text to ids within its vocabulary, and decode those ids, or refuse with a megatron::Error.
#pragma once

#include <string_view>

#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::fuzz {

// Builds the tokenizer `config` describes (its files already written) and runs `text` through it.
void check_tokenizer(const data::TokenizerConfig& config, std::string_view text);

}  // namespace megatron::fuzz
