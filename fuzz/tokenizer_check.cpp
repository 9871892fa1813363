#include "tokenizer_check.h"

#include <cstdlib>

#include "fuzz_support.h"

namespace megatron::fuzz {

void check_tokenizer(const data::TokenizerConfig& config, std::string_view text) {
  expect_clean_rejection([&] {
    const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(config);
    const std::vector<int32_t> ids = tokenizer->encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer->vocab_size()) std::abort();
    expect_clean_rejection([&] { (void)tokenizer->decode(ids); });
    expect_clean_rejection([&] { (void)tokenizer->decode({-1, 0, int32_t(tokenizer->vocab_size())}); });
  });
}

}  // namespace megatron::fuzz
