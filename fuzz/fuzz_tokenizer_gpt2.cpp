// Fuzz target: GPT2BPETokenizer's files. Input: vocab.json, kPartSeparator, merges.txt, kPartSeparator, a
// text to encode.
#include "fuzz_support.h"
#include "tokenizer_check.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  const auto vocab = fuzz::scratch_dir() / "vocab.json", merges = fuzz::scratch_dir() / "merges.txt";
  fuzz::write_file(vocab, parts[0]);
  fuzz::write_file(merges, parts[1]);
  fuzz::check_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = vocab.string(), .merge_file = merges.string()},
                        parts[2]);
  return 0;
}
