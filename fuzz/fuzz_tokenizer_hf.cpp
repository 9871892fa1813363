// Fuzz target: HuggingFaceTokenizer's files. Input: tokenizer.json, kPartSeparator, tokenizer_config.json
// (not written when empty), kPartSeparator, a text to encode.
#include "fuzz_support.h"
#include "tokenizer_check.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  const auto dir = fuzz::scratch_dir() / "hf";
  std::filesystem::remove_all(dir);
  fuzz::write_file(dir / "tokenizer.json", parts[0]);
  if (!parts[1].empty()) fuzz::write_file(dir / "tokenizer_config.json", parts[1]);
  fuzz::check_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = dir.string()}, parts[2]);
  return 0;
}
