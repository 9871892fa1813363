#include "megatron/train/flops.h"

#include "megatron/train/moe_arguments.h"

namespace megatron::train {

double num_floating_point_operations(const Arguments& a, int64_t batch_size, double document_squares) {
  const ModelArguments& m = a.model;
  const double B = double(batch_size), s = m.seq_length, T = B * s;
  const double h = m.hidden_size, f = m.ffn_hidden_size, L = m.num_layers, V = a.padded_vocab_size();
  const double n = m.num_attention_heads, g = m.num_query_groups, d = m.kv_channels;
  const double k = m.swiglu ? 3 : 2;
  // MLPs: dense layers, and on MoE layers the top-k routed experts plus the shared experts (Megatron leaves
  // the router's 2 h E per token out, and so do we).
  double dense_layers = L, moe_layers = 0;
  if (a.moe.num_experts > 0) {
    for (bool is_moe : parse_moe_layer_freq(a.moe.moe_layer_freq, m.num_layers)) moe_layers += is_moe;
    dense_layers = L - moe_layers;
  }
  const double f_moe = a.moe.moe_ffn_hidden_size > 0 ? a.moe.moe_ffn_hidden_size : f;
  const double mlp = 6 * h * k *
                     (f * dense_layers + (f_moe * a.moe.moe_router_topk + a.moe.moe_shared_expert_intermediate_size) * moe_layers);
  const double attention_projections = 6 * L * (h * (n * d + 2 * g * d) + n * d * h);
  const double logits = 6 * h * V;
  const double attention_scores = 6 * n * d * L * (document_squares > 0 ? document_squares : B * s * s);
  return T * (mlp + attention_projections + logits) + attention_scores;
}

double tflops_per_gpu(const Arguments& a, int64_t batch_size, double seconds, double document_squares) {
  return num_floating_point_operations(a, batch_size, document_squares) / (seconds * 1e12 * a.parallel.world_size);
}

}  // namespace megatron::train
