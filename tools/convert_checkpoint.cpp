// convert_checkpoint: Hugging Face <-> megatron.cpp checkpoints (Llama 2/3, Mistral, Qwen2, Mixtral, GPT-2), in
// our spelling, Megatron-LM's tools/checkpoint/convert.py spelling or Megatron Bridge's import/export spelling
// (checkpoint/conversion_command.h lists them):
//
//   convert_checkpoint --direction hf-to-megatron --load-dir <hf model dir> --save-dir <checkpoint root>
//       [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P] [--dtype bf16|fp32]
//   convert_checkpoint --model-type GPT --loader llama_mistral --saver megatron --load-dir HF --save-dir OUT ...
//   convert_checkpoint import --hf-model-path HF --output-path OUT --tp 4 --pp 2
//   convert_checkpoint export --checkpoint-path OUT --output-path HF
//
// The imported checkpoint is a "release" (pretrain_gpt --load fine-tunes from it at iteration 0; generate
// samples from it). Tensors are global, so the target tensor-parallel size only sets the vocabulary padding
// (Megatron's make_vocab_size_divisible_by x TP) and is recorded; the target pipeline size is checked (the
// layers must split evenly) and recorded; a later run at any TP/PP shards at load time.
// Tokenizer files are not converted: point --tokenizer-* flags at the HF directory's files.
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "megatron/checkpoint/conversion_command.h"
#include "megatron/checkpoint/hf_checkpoint.h"
#include "megatron/core/error.h"

using namespace megatron;

namespace {

int run(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << checkpoint::conversion_usage();
      return 0;
    }
  const checkpoint::ConversionRequest r = checkpoint::parse_conversion_command(args);
  for (const std::string& note : r.notes) std::cout << note << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  if (r.import) {
    checkpoint::ImportSummary s = checkpoint::import_hf_checkpoint(r.load_dir, r.save_dir, r.tensor_parallel_size, r.dtype,
                                                                   r.pipeline_parallel_size);
    const train::ModelArguments& m = s.args.model;
    std::cout << "converted " << checkpoint::hf_family_name(s.family) << " (" << m.num_layers << " layers, hidden "
              << m.hidden_size << ", heads " << m.num_attention_heads << ", query groups " << m.num_query_groups;
    if (s.args.moe.num_experts > 0)
      std::cout << ", " << s.args.moe.num_experts << " experts of width " << s.args.moe.moe_ffn_hidden_size << ", top "
                << s.args.moe.moe_router_topk;
    std::cout << ", vocab " << m.vocab_size << " padded to " << s.padded_vocab << ") into " << s.tensors
              << " tensors at " << r.save_dir << "/release";
  } else {
    checkpoint::ExportSummary s = checkpoint::export_hf_checkpoint(r.load_dir, r.save_dir, r.family, r.dtype);
    for (const std::string& w : s.warnings) std::cout << "WARNING: " << w << "\n";
    std::cout << "exported " << s.tensors << " tensors as " << checkpoint::hf_family_name(s.family) << " to "
              << r.save_dir << " (model.safetensors, config.json)";
  }
  std::cout << " in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "convert_checkpoint: error: " << e.what() << "\n";
    return 1;
  }
}
