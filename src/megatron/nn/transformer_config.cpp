#include "megatron/nn/transformer_config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "megatron/core/error.h"

namespace megatron::nn {

double TransformerConfig::output_layer_init_std() const { return init_method_std / std::sqrt(2.0 * num_layers); }

std::vector<std::string> TransformerConfig::violations(int tp) const {
  std::vector<std::string> v;
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  need(num_layers > 0, "--num-layers must be positive (got ", num_layers, ")");
  need(hidden_size > 0, "--hidden-size must be positive (got ", hidden_size, ")");
  need(num_attention_heads > 0, "--num-attention-heads must be positive (got ", num_attention_heads, ")");
  need(kv_channels > 0, "--kv-channels must be positive (got ", kv_channels,
       "; --hidden-size must be divisible by --num-attention-heads)");
  need(num_query_groups > 0 && num_attention_heads % std::max(1, num_query_groups) == 0, "--num-attention-heads ",
       num_attention_heads, " must be divisible by --num-query-groups ", num_query_groups);
  need(ffn_hidden_size > 0, "--ffn-hidden-size must be positive (got ", ffn_hidden_size, ")");
  need(vocab_size > 0, "--vocab-size must be positive (got ", vocab_size, ")");
  need(padded_vocab_size >= vocab_size, "the padded vocabulary ", padded_vocab_size, " must be >= the vocabulary ",
       vocab_size);
  if (position_embedding == PositionEmbedding::LearnedAbsolute)
    need(max_position_embeddings > 0, "--max-position-embeddings must be positive with learned absolute positions (got ",
         max_position_embeddings, ")");
  if (position_embedding == PositionEmbedding::Rope) {
    const int rot = int(double(kv_channels) * rotary_percent);
    need(rot > 0 && rot % 2 == 0, "--rotary-percent ", rotary_percent, " of kv channels ", kv_channels,
         " must give a positive, even number of rotated channels (got ", rot, ")");
  }
  need(norm_epsilon > 0, "--norm-epsilon must be positive (got ", norm_epsilon, ")");
  need(hidden_dropout >= 0 && hidden_dropout < 1, "--hidden-dropout ", hidden_dropout, " must be in [0, 1)");
  need(attention_dropout >= 0 && attention_dropout < 1, "--attention-dropout ", attention_dropout, " must be in [0, 1)");
  need(init_method_std > 0, "--init-method-std must be positive (got ", init_method_std, ")");
  need(tp >= 1, "tensor-parallel size must be positive (got ", tp, ")");
  if (tp > 1) {
    need(num_attention_heads % tp == 0, "--num-attention-heads ", num_attention_heads,
         " must be divisible by --tensor-model-parallel-size ", tp, " (attention is split by heads)");
    need(num_query_groups % tp == 0, "--num-query-groups ", num_query_groups,
         " must be divisible by --tensor-model-parallel-size ", tp, " (each rank holds whole query groups)");
    need(ffn_hidden_size % tp == 0, "--ffn-hidden-size ", ffn_hidden_size,
         " must be divisible by --tensor-model-parallel-size ", tp);
    need(padded_vocab_size % tp == 0, "the padded vocabulary ", padded_vocab_size,
         " must be divisible by --tensor-model-parallel-size ", tp,
         " (pad with --make-vocab-size-divisible-by; the vocabulary is split by rows)");
  }
  need(params_dtype == DType::F32 || params_dtype == DType::BF16 || params_dtype == DType::F16 ||
           params_dtype == DType::F64,
       "parameter dtype must be F32, BF16, F16 or F64 (got ", dtype_name(params_dtype), ")");
  if (fp8.enabled) fp8_violations(tp, v);
  need(recompute.num_layers >= 1, "--recompute-num-layers ", recompute.num_layers, " must be >= 1");
  return v;
}

void TransformerConfig::fp8_violations(int tp, std::vector<std::string>& v) const {
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  need(fp8.amax_history_len >= 1, "--fp8-amax-history-len ", fp8.amax_history_len, " must be >= 1");
  need(fp8.margin >= 0, "--fp8-margin ", fp8.margin, " must be >= 0");
  // cuBLASLt's FP8 GEMMs need every dimension a multiple of 16: the linears' in/out features per TP rank.
  const int64_t t = std::max(tp, 1);
  const int64_t qkv = (num_attention_heads + 2 * int64_t(num_query_groups)) * kv_channels / t;
  const int64_t proj_in = int64_t(num_attention_heads) * kv_channels / t, ffn_local = ffn_hidden_size / t;
  for (const auto& [what, value] : {std::pair<const char*, int64_t>{"--hidden-size", hidden_size},
                                    {"the QKV projection's rows per TP rank", qkv},
                                    {"the attention heads' channels per TP rank", proj_in},
                                    {"--ffn-hidden-size per TP rank", ffn_local}})
    need(value % 16 == 0, "FP8 (--fp8-format): ", what, " = ", value,
         " must be a multiple of 16 (cuBLASLt's FP8 GEMMs)");
}

}  // namespace megatron::nn
