// convert_checkpoint: Hugging Face <-> megatron.cpp checkpoints (Llama 2/3, Mistral, Qwen2, Mixtral, GPT-2).
//
//   convert_checkpoint --direction hf-to-megatron --load-dir <hf model dir> --save-dir <checkpoint root>
//       [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P] [--dtype bf16|fp32]
//   convert_checkpoint --direction megatron-to-hf --load-dir <checkpoint root> --save-dir <hf model dir>
//       [--hf-model-type llama|mistral|qwen2|mixtral|gpt2] [--dtype bf16|fp32]
//
// The imported checkpoint is a "release" (pretrain_gpt --load fine-tunes from it at iteration 0; generate
// samples from it). Tensors are global, so --target-tensor-parallel-size only sets the vocabulary padding
// (Megatron's make_vocab_size_divisible_by x TP) and is recorded; --target-pipeline-parallel-size is checked
// (the layers must split evenly) and recorded; a later run at any TP/PP shards at load time.
// Tokenizer files are not converted: point --tokenizer-* flags at the HF directory's files.
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "megatron/checkpoint/hf_checkpoint.h"
#include "megatron/core/error.h"
#include "megatron/train/tool_flags.h"

using namespace megatron;

namespace {

const char* kUsage =
    "usage: convert_checkpoint --direction hf-to-megatron|megatron-to-hf --load-dir DIR --save-dir DIR\n"
    "                          [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]\n"
    "                          [--hf-model-type llama|mistral|qwen2|mixtral|gpt2]\n"
    "                          [--dtype bf16|fp32]\n";

int run(int argc, char** argv) {
  const train::ToolFlags flags(std::vector<std::string>(argv + 1, argv + argc),
                               {{"--direction"}, {"--load-dir"}, {"--save-dir"}, {"--target-tensor-parallel-size"},
                                {"--target-pipeline-parallel-size"}, {"--hf-model-type"}, {"--dtype"}},
                               kUsage);
  if (flags.help()) {
    std::cout << kUsage;
    return 0;
  }
  for (const char* required : {"--direction", "--load-dir", "--save-dir"}) flags.require(required);
  std::optional<DType> dtype;
  if (flags.has("--dtype")) dtype = flags.choice("--dtype", "", {"bf16", "fp32"}) == "bf16" ? DType::BF16 : DType::F32;
  const std::string load_dir = flags.text("--load-dir"), save_dir = flags.text("--save-dir");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string direction = flags.choice("--direction", "", {"hf-to-megatron", "megatron-to-hf"});
  if (direction == "hf-to-megatron") {
    const int tp = int(flags.integer("--target-tensor-parallel-size", 1, 1, 1 << 20));
    const int pp = int(flags.integer("--target-pipeline-parallel-size", 1, 1, 1 << 20));
    checkpoint::ImportSummary s = checkpoint::import_hf_checkpoint(load_dir, save_dir, tp, dtype, pp);
    const train::ModelArguments& m = s.args.model;
    std::cout << "converted " << checkpoint::hf_family_name(s.family) << " (" << m.num_layers << " layers, hidden "
              << m.hidden_size << ", heads " << m.num_attention_heads << ", query groups " << m.num_query_groups;
    if (s.args.moe.num_experts > 0)
      std::cout << ", " << s.args.moe.num_experts << " experts of width " << s.args.moe.moe_ffn_hidden_size << ", top "
                << s.args.moe.moe_router_topk;
    std::cout << ", vocab " << m.vocab_size << " padded to " << s.padded_vocab << ") into " << s.tensors
              << " tensors at " << save_dir << "/release";
  } else {
    std::optional<checkpoint::HfFamily> family;
    if (flags.has("--hf-model-type")) family = checkpoint::parse_hf_family(flags.text("--hf-model-type"));
    checkpoint::ExportSummary s = checkpoint::export_hf_checkpoint(load_dir, save_dir, family, dtype);
    for (const std::string& w : s.warnings) std::cout << "WARNING: " << w << "\n";
    std::cout << "exported " << s.tensors << " tensors as " << checkpoint::hf_family_name(s.family) << " to "
              << save_dir << " (model.safetensors, config.json)";
  }
  std::cout << " in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "convert_checkpoint: error: " << e.what() << "\n";
    return 1;
  }
}
