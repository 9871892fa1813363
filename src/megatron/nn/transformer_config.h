// TransformerConfig: everything a GPT model (or one pipeline stage of it) is built from, as typed values:
// the architecture, the padded vocabulary, the parameter dtype, the seed and the determinism switch.
// Field names follow Megatron-core's TransformerConfig / the matching command-line flags. nn/ knows nothing
// about flags: train/model_config.h builds this from the parsed arguments (the one place the two meet) and
// maps it back to flag values for checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/nn/fp8_recipe.h"
#include "megatron/nn/moe_config.h"
#include "megatron/nn/recompute.h"

namespace megatron::nn {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };

struct TransformerConfig {
  int num_layers = 0;
  int64_t hidden_size = 0;
  int num_attention_heads = 0;
  int num_query_groups = 0;        // == num_attention_heads: multi-head attention; 1: multi-query
  int64_t kv_channels = 0;         // the head dimension
  int64_t ffn_hidden_size = 0;
  bool swiglu = false;             // gated (SwiGLU) MLP, else GELU (tanh)
  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  // --apply-layernorm-1p (Transformer Engine's zero_centered_gamma): every norm weight w is stored centred on 0
  // and scales by 1 + w (nn/norm.h).
  bool norm_zero_centered_gamma = false;
  PositionEmbedding position_embedding = PositionEmbedding::LearnedAbsolute;
  int64_t max_position_embeddings = 0;  // rows of the learned position table
  double rotary_percent = 1.0;
  double rotary_base = 10000.0;
  bool add_bias_linear = true;
  bool add_qkv_bias = false;  // a bias on linear_qkv even without add_bias_linear (Megatron's --add-qkv-bias, Qwen2)
  // --qk-layernorm: every query and key head normalised over its channels (the --normalization kind, weights of
  // the head dimension shared by the heads) after the QKV projection and before RoPE (Qwen3, OLMo-2 style).
  bool qk_layernorm = false;
  bool share_embeddings_and_output_weights = true;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  // On GPUs: draw attention dropout's masks by element index like the CPU (every layout the same bits; a custom
  // mask for cuDNN, slower) instead of cuDNN's own generator (ops/attention/attention_dropout.h).
  bool attention_dropout_by_index = false;
  double init_method_std = 0.02;
  int64_t vocab_size = 0;          // the tokenizer's
  int64_t padded_vocab_size = 0;   // rows of the word embedding and output layer (a multiple of TP)

  MoeConfig moe;                    // num_experts 0: dense MLPs only
  Fp8Recipe fp8;                    // enabled: the transformer layers' linears run in FP8 (fp8_recipe.h)
  RecomputeConfig recompute;        // activation recomputation in training (recompute.h)

  DType params_dtype = DType::F32;  // also the activation dtype
  uint64_t seed = 1234;             // init (Philox offset = hash of the parameter name) and dropout
  bool deterministic = false;       // --deterministic-mode: only bit-reproducible kernels (attention backward)

  int64_t hidden() const { return hidden_size; }
  int64_t heads() const { return num_attention_heads; }
  int64_t query_groups() const { return num_query_groups; }
  int64_t head_dim() const { return kv_channels; }
  int64_t ffn() const { return ffn_hidden_size; }
  bool bias() const { return add_bias_linear; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool tied() const { return share_embeddings_and_output_weights; }
  // Megatron's scaled init of the output projections (linear_proj, linear_fc2): std / sqrt(2 * num_layers).
  double output_layer_init_std() const;
  // Compute dtype of statistics and gradient buffers: F32, or F64 for F64 parameters.
  DType stats_dtype() const { return params_dtype == DType::F64 ? DType::F64 : DType::F32; }

  // Every violated structural constraint, one sentence each (empty when the model can be built), including
  // the splits over tensor_parallel_size ranks (heads, query groups, ffn size and padded vocabulary
  // divisible by it). Messages name the flags users set these values with.
  std::vector<std::string> violations(int tensor_parallel_size = 1) const;

 private:
  void fp8_violations(int tensor_parallel_size, std::vector<std::string>& out) const;
};

}  // namespace megatron::nn
