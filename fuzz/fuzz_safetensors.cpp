// Fuzz target: safetensors files (HF model weights, our checkpoint shards). Input: the file. A file that
// opens hands out every tensor's bytes, and a CPU tensor over them where the dtype has one.
#include <cstdlib>

#include "fuzz_support.h"
#include "megatron/checkpoint/safetensors.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_file(path, fuzz::as_text(data, size));
  fuzz::expect_clean_rejection([&] {
    const auto file = checkpoint::SafetensorsFile::open(path);
    volatile uint64_t total = 0;  // every byte is read (volatile: the reads are not optimised away)
    for (const checkpoint::SafetensorsEntry& e : file->entries()) {
      const std::span<const std::byte> bytes = file->bytes(e.name);
      if (bytes.size() != e.end - e.begin) std::abort();
      for (std::byte b : bytes) total = total + std::to_integer<uint8_t>(b);
      if (e.dtype) {
        const Tensor t = file->tensor(e.name);
        if (t.nbytes() != bytes.size()) std::abort();
      }
    }
  });
  return 0;
}
