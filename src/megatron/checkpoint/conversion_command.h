// convert_checkpoint's command line in the three spellings users type, mapped to one request (the same
// import_hf_checkpoint / export_hf_checkpoint calls):
//
//   native      --direction hf-to-megatron|megatron-to-hf --load-dir D --save-dir D
//               [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]
//               [--hf-model-type llama|mistral|qwen2|qwen3|mixtral|qwen2_moe|qwen3_moe|gpt2] [--dtype bf16|fp32]
//   convert.py  (Megatron-LM's tools/checkpoint/convert.py and its loaders/savers)
//               --model-type GPT --loader L --saver S --load-dir D --save-dir D
//               [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P] [--target-expert-parallel-size E]
//               [--tokenizer-model F] [--checkpoint-type hf] [--model-size M] [--bf16] [--true-vocab-size V]
//               [--make-vocab-size-divisible-by 128] [--vocab-file F] [--megatron-path D] [--max-queue-size N]
//               [--no-checking] [--loader-transformer-impl X] [--saver-transformer-impl X]
//               Loaders/savers: llama_mistral, mixtral_hf (or mixtral, loader_mixtral_hf) and hf read/write Hugging Face
//               directories; megatron, mcore, core and legacy are our checkpoints (convert.py's default is megatron).
//               --model-size picks the exported family (llama2-*, llama3, yi-34B: llama; mistral; qwen2.5: qwen2);
//               without it, the family recorded at import.
//   Bridge      (Megatron Bridge's conversion script) import --hf-model-path|--hf-model P --output-path|--megatron-path D
//               [--tp N] [--pp P] [--ep E] [--etp E] [--torch-dtype float32|bfloat16]
//               export --checkpoint-path|--megatron-path D --output-path|--hf-path P [--hf-model P]
//               [--torch-dtype|--export-weight-dtype float32|bfloat16] [--tp N] [--pp P] ...
//
// Flags that change nothing here (worker counts, implementation choices, the tokenizer file, which is not
// converted) are accepted; what cannot be honoured is refused naming the flag and what to use instead (Meta's
// original checkpoint format, fp16 weights, BERT, a vocabulary trim, a checkpoint-to-checkpoint reshard, which
// our layout-free checkpoints do not need).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "megatron/checkpoint/hf_convert.h"
#include "megatron/core/dtype.h"

namespace megatron::checkpoint {

struct ConversionRequest {
  bool import = true;          // Hugging Face -> ours (else ours -> Hugging Face)
  std::string load_dir, save_dir;
  int tensor_parallel_size = 1;    // import: the vocabulary padding's TP (recorded)
  int pipeline_parallel_size = 1;  // import: checked and recorded
  std::optional<HfFamily> family;  // export: the family to write
  std::optional<DType> dtype;      // convert floating weights (default: keep)
  std::string spelling;            // "native", "convert.py" or "bridge"
  std::vector<std::string> notes;  // accepted flags that change nothing, one line each (printed)
};

// `args`: argv without the program name. Throws megatron::Error listing every problem (unknown flags with the
// nearest known one, missing values, refusals) at once.
ConversionRequest parse_conversion_command(const std::vector<std::string>& args);

// The usage text of the three spellings.
std::string conversion_usage();

}  // namespace megatron::checkpoint
