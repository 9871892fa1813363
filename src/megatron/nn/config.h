// ModelConfig: the resolved architecture a GPTModel is built from (Megatron's model flags plus what the
// run decides: the parameter dtype, the padded vocabulary and the seed).
//
// make_model_config() resolves Megatron's derived defaults (ffn size, kv channels, query groups, max
// positions) and throws megatron::Error listing every architecture constraint that is violated, plus what
// this library does not support yet (attention dropout > 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/train/arguments.h"

namespace megatron::nn {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };

struct ModelConfig {
  train::ModelArguments args;   // resolved (kv_channels, num_query_groups, ffn_hidden_size, ... set)
  int64_t padded_vocab_size = 0;
  DType params_dtype = DType::F32;  // also the activation dtype
  uint64_t seed = 1234;         // init (Philox offset = hash of the parameter name) and dropout
  bool deterministic = false;   // --deterministic-mode: only bit-reproducible kernels (attention backward)

  int num_layers() const { return args.num_layers; }
  int64_t hidden() const { return args.hidden_size; }
  int64_t heads() const { return args.num_attention_heads; }
  int64_t query_groups() const { return args.num_query_groups; }
  int64_t head_dim() const { return args.kv_channels; }
  int64_t ffn() const { return args.ffn_hidden_size; }
  bool bias() const { return !args.disable_bias_linear; }
  bool tied() const { return !args.untie_embeddings_and_output_weights; }
  Normalization normalization() const {
    return args.normalization == "RMSNorm" ? Normalization::RMSNorm : Normalization::LayerNorm;
  }
  PositionEmbedding position_embedding() const {
    if (args.position_embedding_type == "rope") return PositionEmbedding::Rope;
    if (args.position_embedding_type == "none") return PositionEmbedding::None;
    return PositionEmbedding::LearnedAbsolute;
  }
  // Megatron's scaled init of the output projections (linear_proj, linear_fc2).
  double output_layer_init_std() const;
  // Compute dtype of statistics and gradient buffers: F32, or F64 for F64 parameters.
  DType stats_dtype() const { return params_dtype == DType::F64 ? DType::F64 : DType::F32; }
};

// Resolves and validates; padded vocab = vocab_size rounded up to make_vocab_size_divisible_by *
// tensor_parallel_size (Megatron's rule), and the architecture must split over that many TP ranks.
ModelConfig make_model_config(train::ModelArguments args, DType params_dtype, uint64_t seed,
                              int tensor_parallel_size = 1);

// Every violated constraint (empty when the configuration can be built), including the splits over
// tensor_parallel_size ranks (heads, query groups, ffn size and padded vocabulary divisible by it).
std::vector<std::string> model_config_violations(const ModelConfig& config, int tensor_parallel_size = 1);

}  // namespace megatron::nn
