// --yaml-cfg FILE: Megatron-LM's YAML configuration (megatron/training/yaml_arguments.py, the format of its
// examples/gpt3/gpt_config.yaml), read with yaml-cpp and turned into the flags it stands for, which the flag
// parser then reads like a command line (same checks, same refusals with their reasons).
//
// The format: top-level keys are Megatron's argument names (micro_batch_size, lr, data_path, ...); the
// `language_model` section holds TransformerConfig fields and `model_parallel` ModelParallelConfig fields.
//   - key k -> --k with '-' for '_', after the renames of the two sections (layernorm_epsilon -> --norm-epsilon,
//     num_moe_experts -> --num-experts, fp8 -> --fp8-format, layernorm_zero_centered_gamma ->
//     --apply-layernorm-1p, add_bias_linear: false -> --disable-bias-linear, activation_func: swiglu ->
//     --swiglu, gated_linear_unit with swiglu, fp8_wgrad: false -> --no-fp8-wgrad, ...);
//   - null: not given; true: the switch; false: nothing, or --no-k / --disable-k when that is the flag (Megatron's
//     store_false arguments, e.g. masked_softmax_fusion: false -> --no-masked-softmax-fusion); a list: its values;
//     ${VAR} in a string: the environment variable (Megatron's !pathex resolver; an unset one is an error);
//   - a key this build has no flag for is accepted only when it holds null, false, or Megatron's default for a
//     setting that changes nothing here (a fusion on, initialisation on, ...); any other value is an error that
//     names the key, so nothing in the file is silently ignored.
// Megatron ignores every other command-line argument when --yaml-cfg is given; here they are refused (move
// them into the file), so that none is silently dropped.
#pragma once

#include <string>
#include <vector>

namespace megatron::train {

// The flags `path` stands for. Throws megatron::Error listing every key it cannot honour, or naming the file
// and line of a YAML syntax error; also when this build has no yaml-cpp.
std::vector<std::string> yaml_config_flags(const std::string& path);

// Whether this build reads YAML (yaml-cpp found at configure time).
bool yaml_config_available();

}  // namespace megatron::train
