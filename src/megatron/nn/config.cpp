#include "megatron/nn/config.h"

#include <cmath>

#include "megatron/core/error.h"

namespace megatron::nn {

double ModelConfig::output_layer_init_std() const {
  return args.init_method_std / std::sqrt(2.0 * args.num_layers);
}

std::vector<std::string> model_config_violations(const ModelConfig& c, int tp) {
  std::vector<std::string> v;
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  const train::ModelArguments& m = c.args;
  need(m.num_layers > 0, "--num-layers must be positive (got ", m.num_layers, ")");
  need(m.hidden_size > 0, "--hidden-size must be positive (got ", m.hidden_size, ")");
  need(m.num_attention_heads > 0, "--num-attention-heads must be positive (got ", m.num_attention_heads, ")");
  need(m.kv_channels > 0, "--kv-channels must be positive (got ", m.kv_channels,
       "; --hidden-size must be divisible by --num-attention-heads)");
  need(m.num_query_groups > 0 && m.num_attention_heads % std::max(1, m.num_query_groups) == 0,
       "--num-attention-heads ", m.num_attention_heads, " must be divisible by --num-query-groups ",
       m.num_query_groups);
  need(m.ffn_hidden_size > 0, "--ffn-hidden-size must be positive (got ", m.ffn_hidden_size, ")");
  need(m.seq_length > 0, "--seq-length must be positive (got ", m.seq_length, ")");
  need(m.vocab_size > 0, "--vocab-size must be positive (got ", m.vocab_size, ")");
  need(m.position_embedding_type == "learned_absolute" || m.position_embedding_type == "rope" ||
           m.position_embedding_type == "none",
       "--position-embedding-type '", m.position_embedding_type, "' must be learned_absolute, rope or none");
  if (m.position_embedding_type == "learned_absolute")
    need(m.max_position_embeddings >= m.seq_length, "--max-position-embeddings ", m.max_position_embeddings,
         " must be >= --seq-length ", m.seq_length);
  if (m.position_embedding_type == "rope") {
    int rot = int(m.kv_channels * m.rotary_percent);
    need(rot > 0 && rot % 2 == 0, "--rotary-percent ", m.rotary_percent, " of kv channels ", m.kv_channels,
         " must give a positive, even number of rotated channels (got ", rot, ")");
  }
  need(m.normalization == "LayerNorm" || m.normalization == "RMSNorm", "--normalization '", m.normalization,
       "' must be LayerNorm or RMSNorm");
  need(m.hidden_dropout >= 0 && m.hidden_dropout < 1, "--hidden-dropout ", m.hidden_dropout, " must be in [0, 1)");
  need(m.attention_dropout == 0, "--attention-dropout ", m.attention_dropout,
       " is not supported yet (the fused attention op has no dropout); pass --attention-dropout 0");
  need(m.init_method_std > 0, "--init-method-std must be positive (got ", m.init_method_std, ")");
  need(tp >= 1, "tensor-parallel size must be positive (got ", tp, ")");
  if (tp > 1) {
    need(m.num_attention_heads % tp == 0, "--num-attention-heads ", m.num_attention_heads,
         " must be divisible by --tensor-model-parallel-size ", tp, " (attention is split by heads)");
    need(m.num_query_groups % tp == 0, "--num-query-groups ", m.num_query_groups,
         " must be divisible by --tensor-model-parallel-size ", tp, " (each rank holds whole query groups)");
    need(m.ffn_hidden_size % tp == 0, "--ffn-hidden-size ", m.ffn_hidden_size,
         " must be divisible by --tensor-model-parallel-size ", tp);
    need(c.padded_vocab_size % tp == 0, "the padded vocabulary ", c.padded_vocab_size,
         " must be divisible by --tensor-model-parallel-size ", tp,
         " (pad with --make-vocab-size-divisible-by; the vocabulary is split by rows)");
  }
  need(c.params_dtype == DType::F32 || c.params_dtype == DType::BF16 || c.params_dtype == DType::F16 ||
           c.params_dtype == DType::F64,
       "parameter dtype must be F32, BF16, F16 or F64 (got ", dtype_name(c.params_dtype), ")");
  return v;
}

ModelConfig make_model_config(train::ModelArguments args, DType params_dtype, uint64_t seed,
                              int tensor_parallel_size) {
  train::Arguments all;
  all.model = std::move(args);
  all.parallel.tensor_model_parallel_size = tensor_parallel_size;
  train::resolve(all);
  ModelConfig c;
  c.args = all.model;
  c.padded_vocab_size = all.padded_vocab_size();
  c.params_dtype = params_dtype;
  c.seed = seed;
  std::vector<std::string> v = model_config_violations(c, tensor_parallel_size);
  if (!v.empty()) {
    std::string msg = "invalid model configuration:";
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  return c;
}

}  // namespace megatron::nn
