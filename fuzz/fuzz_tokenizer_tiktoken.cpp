// Fuzz target: TikTokenizer's ranks file (tiktoken's "base64 rank" lines or Megatron's JSON list). Input:
// the ranks file, kPartSeparator, a text to encode. An odd first byte selects Megatron's layout (special
// tokens first, every rank shifted) with a vocabulary cap, as --tiktoken-num-special-tokens and --vocab-size.
#include "fuzz_support.h"
#include "tokenizer_check.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const auto ranks = fuzz::scratch_dir() / "ranks.tiktoken";
  fuzz::write_file(ranks, parts[0]);
  data::TokenizerConfig config{.type = "TikTokenizer", .tokenizer_model = ranks.string()};
  if (size > 0 && data[0] % 2 == 1) {
    config.tiktoken_num_special_tokens = 5;
    config.vocab_size = 300;
  }
  fuzz::check_tokenizer(config, parts[1]);
  return 0;
}
