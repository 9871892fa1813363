// Hugging Face <-> megatron.cpp weights: Llama 2/3, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE and GPT-2
// checkpoints (config.json + model.safetensors, or model.safetensors.index.json + shards) to our global tensors,
// and back.
//
// Architecture (config.json -> ModelArguments):
//   Llama/Mistral/Qwen2: RMSNorm (rms_norm_eps), SwiGLU (hidden_act silu; intermediate_size), RoPE (rope_theta,
//     partial_rotary_factor -> rotary_percent; rope scaling other than "default" is refused), GQA
//     (num_key_value_heads), head_dim (or hidden/heads), untied unless tie_word_embeddings. Biases: Qwen2's q/k/v
//     biases (and Llama's attention_bias/mlp_bias) need --disable-bias-linear off, which gives every linear a
//     bias: the ones HF lacks are zero on import and must be zero (else a warning, and dropped) on export.
//   Mixtral: Mistral's attention and norms; every layer an MoE block: num_local_experts -> --num-experts,
//     num_experts_per_tok -> --moe-router-topk, intermediate_size -> --moe-ffn-hidden-size (and
//     --ffn-hidden-size), router_aux_loss_coef -> --moe-aux-loss-coeff (training only). Its router (softmax
//     over all experts, top-k, renormalised over the k) is ours without --moe-router-pre-softmax; top-1 needs
//     pre-softmax here (Megatron's rule), which does not renormalise, so num_experts_per_tok 1 is refused,
//     as is a training-time router_jitter_noise. Export refuses MoE options Mixtral cannot express.
//   Qwen3: Llama's layout with q_norm/k_norm (per-head RMSNorm of queries and keys before RoPE) ->
//     --qk-layernorm; attention_bias puts biases on q, k, v and o.
//   Qwen3-MoE: Qwen3's attention; num_local_experts (transformers 4: num_experts) -> --num-experts,
//     num_experts_per_tok -> --moe-router-topk, moe_intermediate_size -> --moe-ffn-hidden-size,
//     intermediate_size -> --ffn-hidden-size (its dense layers); the MoE layers (every decoder_sparse_step-th,
//     1-based, except mlp_only_layers) -> --moe-layer-freq (a list when not every layer); norm_topk_prob false
//     (softmax over all experts, top-k, not renormalised) -> --moe-router-pre-softmax, true -> Mixtral's router;
//     router_aux_loss_coef -> --moe-aux-loss-coeff.
//   Qwen2-MoE: Qwen2's attention (q/k/v biases: qkv_bias, default true), its MoE layers and router as Qwen3-MoE's,
//     and a shared expert on every MoE layer: shared_expert_intermediate_size -> --moe-shared-expert-intermediate-size
//     with its per-token sigmoid gate -> --moe-shared-expert-gate.
//   GPT-2: LayerNorm (layer_norm_epsilon), GELU tanh (gelu_new), learned positions (n_positions), tied, biases.
//   Vocabulary: vocab_size as in HF; our padded rows (make_vocab_size_divisible_by 128) are zero on import and
//   dropped on export.
// Weights (Megatron-core names on our side):
//   q/k/v_proj [n*d, h], [g*d, h], [g*d, h] -> linear_qkv [g*(n/g+2)*d, h]: per query group j, its n/g query
//     heads, then key head j, then value head j (the fused layout of nn/attention.h); biases alike.
//   gate_proj, up_proj -> linear_fc1 = [gate; up]; down_proj -> linear_fc2; o_proj -> linear_proj.
//   q_norm/k_norm [d] -> self_attention.q_layernorm/k_layernorm.weight.
//   Qwen2-MoE and Qwen3-MoE mlp.gate [E, h] -> mlp.router.weight; mlp.experts.e.gate_proj, up_proj, down_proj as
//     Mixtral's w1, w3, w2 below (hf_host_tensors.h); Qwen2-MoE's mlp.shared_expert.gate_proj, up_proj ->
//     mlp.shared_experts.linear_fc1 = [gate; up], down_proj -> linear_fc2, mlp.shared_expert_gate [1, h] ->
//     mlp.shared_experts.gate_weight.
//   Mixtral block_sparse_moe.gate [E, h] -> mlp.router.weight; experts.e.w1 (gate), w3 (up) [F, h] ->
//     mlp.experts.linear_fc1.weight[e] = [w1; w3] ([E, 2F, h]); experts.e.w2 [h, F] -> linear_fc2.weight[e]
//     ([E, h, F]). transformers 5's fused layout (mlp.gate, mlp.experts.gate_up_proj [E, 2F, h] = [gate; up]
//     per expert, mlp.experts.down_proj [E, h, F]) is read too; export writes the per-expert layout, which is
//     what transformers' save_pretrained writes.
//   GPT-2 Conv1D weights are stored [in, out]: transposed; c_attn [h, 3h] = [q | k | v] columns, fused as above
//     with one head per group.
//   Norms: input_layernorm -> input_layernorm, post_attention_layernorm / ln_2 -> pre_mlp_layernorm, model.norm /
//     ln_f -> decoder.final_layernorm. With --apply-layernorm-1p our norm weights are the HF scales minus 1.
// HF buffers that are not weights (rotary inv_freq, GPT-2's attn.bias masks) are ignored; any other unused HF
// tensor is an error naming it (an unsupported feature must not be dropped silently).
// Tensor parallelism: our tensors are global (layout-free), so a "target TP" changes nothing in the files;
// it is recorded in the checkpoint's state and TP sharding happens at load time (sharded_tensor.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/dtype.h"
#include "megatron/train/arguments.h"

namespace megatron::checkpoint {

enum class HfFamily { Llama, Mistral, Qwen2, Qwen3, GPT2, Mixtral, Qwen2Moe, Qwen3Moe };
// "llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe"; others throw.
HfFamily parse_hf_family(const std::string& name);
const char* hf_family_name(HfFamily f);

// A host tensor of any dtype: the unit of conversion.
struct HostTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  int64_t numel() const;
};
using TensorMap = std::map<std::string, HostTensor>;

// The family named by config.json's model_type; throws for others.
HfFamily hf_family_of(const nlohmann::json& config);
// The model and MoE arguments for an HF config, resolved (the other groups keep their defaults); throws
// listing everything unsupported at once.
train::Arguments arguments_from_hf(const nlohmann::json& config);
// config.json for our model and MoE arguments (resolved), starting from `base` (the original HF config when
// known: token ids and other fields survive a round trip) and overriding every architecture field. Throws
// when the model does not have the family's shape, naming what differs.
nlohmann::json hf_config_from_model(HfFamily family, const train::Arguments& args, DType dtype,
                                    const nlohmann::json& base = nlohmann::json::object());

// Weight renaming/reshaping. `args`: model and MoE groups resolved; `padded_vocab` = our embedding rows.
TensorMap hf_to_megatron(HfFamily family, const train::Arguments& args, int64_t padded_vocab, const TensorMap& hf);
// `warnings` receives a line per dropped non-zero tensor (biases HF cannot hold).
TensorMap megatron_to_hf(HfFamily family, const train::Arguments& args, const TensorMap& ours,
                         std::vector<std::string>* warnings = nullptr);

// Reading and writing HF directories.
nlohmann::json read_hf_config(const std::filesystem::path& dir);
TensorMap read_hf_weights(const std::filesystem::path& dir);  // model.safetensors or the index + shards
void write_hf_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const TensorMap& tensors);

// Casts every floating tensor to `dtype` (others untouched); CUDA's rounding when narrowing.
void cast_floats(TensorMap& tensors, DType dtype);

}  // namespace megatron::checkpoint
