#include "megatron/train/model_config.h"

#include "megatron/core/error.h"
#include "megatron/train/fp8_arguments.h"
#include "megatron/train/moe_arguments.h"
#include "megatron/train/recompute_arguments.h"

namespace megatron::train {

DType params_dtype(const TrainingArguments& t) { return t.bf16 ? DType::BF16 : (t.fp16 ? DType::F16 : DType::F32); }

nn::TransformerConfig transformer_config(ModelArguments args, DType dtype, uint64_t seed, int tensor_parallel_size) {
  Arguments all;
  all.model = std::move(args);
  all.parallel.tensor_model_parallel_size = tensor_parallel_size;
  resolve(all);
  const ModelArguments& m = all.model;
  nn::TransformerConfig c;
  c.num_layers = m.num_layers;
  c.hidden_size = m.hidden_size;
  c.num_attention_heads = m.num_attention_heads;
  c.num_query_groups = m.num_query_groups;
  c.kv_channels = m.kv_channels;
  c.ffn_hidden_size = m.ffn_hidden_size;
  c.swiglu = m.swiglu;
  c.normalization = m.normalization == "RMSNorm" ? nn::Normalization::RMSNorm : nn::Normalization::LayerNorm;
  c.norm_epsilon = m.norm_epsilon;
  c.norm_zero_centered_gamma = m.apply_layernorm_1p;
  c.position_embedding = m.position_embedding_type == "rope"   ? nn::PositionEmbedding::Rope
                         : m.position_embedding_type == "none" ? nn::PositionEmbedding::None
                                                               : nn::PositionEmbedding::LearnedAbsolute;
  c.max_position_embeddings = m.max_position_embeddings;
  c.rotary_percent = m.rotary_percent;
  c.rotary_base = m.rotary_base;
  c.add_bias_linear = !m.disable_bias_linear;
  c.add_qkv_bias = m.add_qkv_bias;
  c.qk_layernorm = m.qk_layernorm;
  c.share_embeddings_and_output_weights = !m.untie_embeddings_and_output_weights;
  c.hidden_dropout = m.hidden_dropout;
  c.attention_dropout = m.attention_dropout;
  c.attention_dropout_by_index = m.attention_dropout_masks == "by-index";
  c.init_method_std = m.init_method_std;
  c.vocab_size = m.vocab_size;
  c.padded_vocab_size = all.padded_vocab_size();
  c.params_dtype = dtype;
  c.seed = seed;

  std::vector<std::string> v;
  // The flag spellings the typed configuration cannot hold: an unknown name would silently pick a default.
  if (m.normalization != "LayerNorm" && m.normalization != "RMSNorm")
    v.push_back(str_cat("--normalization '", m.normalization, "' must be LayerNorm or RMSNorm"));
  if (m.position_embedding_type != "learned_absolute" && m.position_embedding_type != "rope" &&
      m.position_embedding_type != "none")
    v.push_back(str_cat("--position-embedding-type '", m.position_embedding_type,
                        "' must be learned_absolute, rope or none"));
  if (m.seq_length <= 0) v.push_back(str_cat("--seq-length must be positive (got ", m.seq_length, ")"));
  if (c.position_embedding == nn::PositionEmbedding::LearnedAbsolute && m.max_position_embeddings < m.seq_length)
    v.push_back(str_cat("--max-position-embeddings ", m.max_position_embeddings, " must be >= --seq-length ",
                        m.seq_length));
  for (std::string& s : c.violations(tensor_parallel_size)) v.push_back(std::move(s));
  if (!v.empty()) {
    std::string msg = "invalid model configuration:";
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  return c;
}

nn::MoeConfig moe_config(const MoeArguments& m, const ModelArguments& model) {
  nn::MoeConfig c;
  if (m.num_experts <= 0) return c;
  c.num_experts = m.num_experts;
  c.ffn_hidden_size = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : model.ffn_hidden_size;
  c.topk = m.moe_router_topk;
  c.score = m.moe_router_score_function == "sigmoid"        ? nn::RouterScore::Sigmoid
            : m.moe_router_score_function == "sqrtsoftplus" ? nn::RouterScore::SqrtSoftplus
                                                            : nn::RouterScore::Softmax;
  c.pre_softmax = m.moe_router_pre_softmax;
  c.num_groups = m.moe_router_num_groups;
  c.group_topk = m.moe_router_group_topk;
  c.topk_scaling_factor = m.moe_router_topk_scaling_factor;
  for (const auto& [type, coeff] : moe_load_balancing(m)) {
    c.sinkhorn = c.sinkhorn || type == "sinkhorn";
    if (coeff <= 0 || type == "none") continue;
    c.aux_losses.push_back({type == "seq_aux_loss"      ? nn::AuxLossType::SeqAuxLoss
                            : type == "global_aux_loss" ? nn::AuxLossType::GlobalAuxLoss
                                                        : nn::AuxLossType::AuxLoss,
                            coeff});
  }
  c.z_loss_coeff = m.moe_z_loss_coeff;
  c.expert_bias = m.moe_router_enable_expert_bias;
  c.bias_update_rate = m.moe_router_bias_update_rate;
  c.capacity_factor = m.moe_expert_capacity_factor;
  c.drop_policy = m.moe_token_drop_policy == "position" ? nn::TokenDropPolicy::Position : nn::TokenDropPolicy::Probs;
  c.pad_to_capacity = m.moe_pad_expert_input_to_capacity;
  c.dispatcher = m.moe_token_dispatcher_type == "alltoall" ? nn::TokenDispatcher::AllToAll : nn::TokenDispatcher::AllGather;
  c.shared_expert_ffn = m.moe_shared_expert_intermediate_size;
  c.shared_expert_gate = m.moe_shared_expert_gate;
  c.per_expert_gemm = m.moe_expert_gemm == "per-expert";
  c.layer_is_moe = parse_moe_layer_freq(m.moe_layer_freq, model.num_layers);
  return c;
}

nn::TransformerConfig transformer_config(const Arguments& args, uint64_t seed) {
  nn::TransformerConfig c = transformer_config(args.model, params_dtype(args.training), seed,
                                               args.parallel.tensor_model_parallel_size);
  c.deterministic = args.training.deterministic_mode;
  Arguments resolved = args;
  resolve(resolved);
  c.moe = moe_config(resolved.moe, resolved.model);
  c.fp8 = fp8_recipe(resolved);
  c.recompute = recompute_config(resolved);
  return c;
}

ModelArguments model_arguments(const nn::TransformerConfig& c) {
  ModelArguments m;
  m.num_layers = c.num_layers;
  m.hidden_size = int(c.hidden_size);
  m.num_attention_heads = c.num_attention_heads;
  m.num_query_groups = c.num_query_groups;
  m.group_query_attention = c.num_query_groups != c.num_attention_heads;
  m.kv_channels = int(c.kv_channels);
  m.ffn_hidden_size = int(c.ffn_hidden_size);
  m.swiglu = c.swiglu;
  m.normalization = c.normalization == nn::Normalization::RMSNorm ? "RMSNorm" : "LayerNorm";
  m.norm_epsilon = c.norm_epsilon;
  m.apply_layernorm_1p = c.norm_zero_centered_gamma;
  m.position_embedding_type = c.position_embedding == nn::PositionEmbedding::Rope   ? "rope"
                              : c.position_embedding == nn::PositionEmbedding::None ? "none"
                                                                                    : "learned_absolute";
  m.max_position_embeddings = int(c.max_position_embeddings);
  m.rotary_percent = c.rotary_percent;
  m.rotary_base = c.rotary_base;
  m.disable_bias_linear = !c.add_bias_linear;
  m.add_qkv_bias = c.add_qkv_bias;
  m.qk_layernorm = c.qk_layernorm;
  m.untie_embeddings_and_output_weights = !c.share_embeddings_and_output_weights;
  m.hidden_dropout = c.hidden_dropout;
  m.attention_dropout = c.attention_dropout;
  m.attention_dropout_masks = c.attention_dropout_by_index ? "by-index" : "device";
  m.init_method_std = c.init_method_std;
  m.vocab_size = int(c.vocab_size);
  return m;
}

}  // namespace megatron::train
