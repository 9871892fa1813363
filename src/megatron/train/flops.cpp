#include "megatron/train/flops.h"

namespace megatron::train {

double num_floating_point_operations(const Arguments& a, int64_t batch_size) {
  const ModelArguments& m = a.model;
  const double B = double(batch_size), s = m.seq_length, T = B * s;
  const double h = m.hidden_size, f = m.ffn_hidden_size, L = m.num_layers, V = a.padded_vocab_size();
  const double n = m.num_attention_heads, g = m.num_query_groups, d = m.kv_channels;
  const double k = m.swiglu ? 3 : 2;
  const double mlp = 6 * h * f * k * L;
  const double attention_projections = 6 * L * (h * (n * d + 2 * g * d) + n * d * h);
  const double logits = 6 * h * V;
  const double attention_scores = 6 * n * d * L * (B * s * s);
  return T * (mlp + attention_projections + logits) + attention_scores;
}

double tflops_per_gpu(const Arguments& a, int64_t batch_size, double seconds) {
  return num_floating_point_operations(a, batch_size) / (seconds * 1e12 * a.parallel.world_size);
}

}  // namespace megatron::train
