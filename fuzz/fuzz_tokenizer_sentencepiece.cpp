// Fuzz target: SentencePieceTokenizer's model file (a serialized protobuf, parsed by libsentencepiece; what
// is ours is how a load or encode failure becomes an error). Input: the .model bytes, kPartSeparator, a text.
#include "fuzz_support.h"
#include "tokenizer_check.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const auto model = fuzz::scratch_dir() / "tokenizer.model";
  fuzz::write_file(model, parts[0]);
  fuzz::check_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = model.string()}, parts[1]);
  return 0;
}
