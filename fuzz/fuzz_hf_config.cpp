// Fuzz target: a Hugging Face model's config.json as convert_checkpoint --direction hf-to-megatron reads it:
// the family, the model and MoE arguments (and their constraints), and the config written back for export.
// Input: config.json.
#include "fuzz_support.h"
#include "megatron/checkpoint/hf_convert.h"
#include "megatron/core/dtype.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch_dir() / "hf";
  fuzz::write_file(dir / "config.json", fuzz::as_text(data, size));
  fuzz::expect_clean_rejection([&] {
    const nlohmann::json config = checkpoint::read_hf_config(dir);
    const checkpoint::HfFamily family = checkpoint::hf_family_of(config);
    const train::Arguments args = checkpoint::arguments_from_hf(config);
    (void)checkpoint::hf_config_from_model(family, args, DType::BF16, config).dump();
  });
  return 0;
}
