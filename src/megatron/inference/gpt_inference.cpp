#include "megatron/inference/gpt_inference.h"

#include "megatron/inference/cached_attention.h"
#include "megatron/ops/activation/activation.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/embedding/embedding.h"
#include "megatron/ops/norm/norm.h"
#include "megatron/ops/rope/rope.h"

namespace megatron::inference {

GPTInference::GPTInference(Context& ctx, nn::GPTModel& model, int64_t batch, int64_t max_length)
    : model_(model), batch_(batch), max_length_(max_length) {
  const nn::ModelConfig& c = model.config();
  MEGATRON_CHECK(batch > 0 && max_length > 0, "GPTInference: batch ", batch, " and max length ", max_length,
                 " must be positive");
  if (c.position_embedding() == nn::PositionEmbedding::LearnedAbsolute)
    MEGATRON_CHECK(max_length <= c.args.max_position_embeddings, "GPTInference: max length ", max_length,
                   " exceeds the model's --max-position-embeddings ", c.args.max_position_embeddings);
  for (int i = 0; i < c.num_layers(); ++i) {
    k_cache_.push_back(ctx.empty({batch, max_length, c.query_groups(), c.head_dim()}, c.params_dtype));
    v_cache_.push_back(ctx.empty({batch, max_length, c.query_groups(), c.head_dim()}, c.params_dtype));
  }
}

Tensor GPTInference::norm(Context& ctx, const nn::Norm& n, const Tensor& x) {
  const nn::ModelConfig& c = model_.config();
  Tensor y = ctx.empty(x.shape(), x.dtype());
  Tensor rstd = ctx.empty({x.shape().rows()}, c.stats_dtype());
  const float eps = float(c.args.norm_epsilon);
  if (c.normalization() == nn::Normalization::LayerNorm) {
    Tensor mean = ctx.empty({x.shape().rows()}, c.stats_dtype());
    ops::layer_norm_forward(ctx, y, mean, rstd, x, n.weight.value, n.bias.value, eps);
  } else {
    ops::rms_norm_forward(ctx, y, rstd, x, n.weight.value, eps);
  }
  return y;
}

Tensor GPTInference::forward(Context& ctx, const Tensor& tokens_in) {
  const nn::ModelConfig& c = model_.config();
  MEGATRON_CHECK(tokens_in.rank() == 2 && tokens_in.dim(0) == batch_, "GPTInference: tokens must be [", batch_,
                 ", S], got ", tokens_in.describe());
  const int64_t B = batch_, S = tokens_in.dim(1), T = B * S, h = c.hidden();
  const int64_t n = c.heads(), g = c.query_groups(), d = c.head_dim(), r = n / g;
  MEGATRON_CHECK(length_ + S <= max_length_, "GPTInference: ", length_, " cached + ", S, " new tokens exceed the ",
                 "cache of ", max_length_);
  const DType dt = c.params_dtype;
  Tensor tokens = tokens_in;
  if (tokens_in.device() != ctx.device()) {
    tokens = ctx.empty(tokens_in.shape(), tokens_in.dtype());
    copy_tensor(ctx, tokens, tokens_in);
  }

  // Embedding (+ learned positions at absolute positions).
  Tensor x = ctx.empty({B, S, h}, dt);
  ops::embedding_forward(ctx, x, model_.embedding.word_embeddings.weight.value, tokens);
  if (model_.embedding.position_embeddings.defined()) {
    std::vector<int64_t> ids(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) ids[size_t(b * S + s)] = length_ + s;
    Tensor pos_ids = ctx.empty({B, S}, DType::I64);
    copy_tensor(ctx, pos_ids, Tensor::from_blob(ids.data(), {B, S}, DType::I64, Device::cpu()));
    Tensor pos = ctx.empty({B, S, h}, dt);
    ops::embedding_forward(ctx, pos, model_.embedding.position_embeddings.value, pos_ids);
    ops::add(ctx, x, x, pos);
    ctx.synchronize();  // `ids` dies here
  }

  const ops::RopeOptions rope{.base = c.args.rotary_base, .rotary_percent = c.args.rotary_percent,
                              .position_offset = length_};
  for (size_t i = 0; i < model_.layers.size(); ++i) {
    nn::TransformerLayer& layer = model_.layers[i];
    nn::SelfAttention& attn = layer.self_attention;
    Tensor ln1 = norm(ctx, layer.input_layernorm, x);
    Tensor qkv = ctx.empty({B, S, g * (r + 2) * d}, dt);
    nn::linear_forward(ctx, qkv, ln1, attn.linear_qkv.weight, attn.linear_qkv.bias.defined() ? &attn.linear_qkv.bias : nullptr);
    // Split the fused projection (nn/attention.h's layout) with transposes.
    Tensor qkv_t = ctx.empty({(r + 2) * d, T * g}, dt);
    ops::transpose(ctx, qkv_t, qkv.view({T * g, (r + 2) * d}));
    Tensor q = ctx.empty({B, S, n, d}, dt), k = ctx.empty({B, S, g, d}, dt), v = ctx.empty({B, S, g, d}, dt);
    ops::transpose(ctx, q.view({T * g, r * d}), qkv_t.slice(0, r * d));
    ops::transpose(ctx, k.view({T * g, d}), qkv_t.slice(r * d, (r + 1) * d));
    ops::transpose(ctx, v.view({T * g, d}), qkv_t.slice((r + 1) * d, (r + 2) * d));
    if (c.position_embedding() == nn::PositionEmbedding::Rope) {
      ops::rope_forward(ctx, q, q, rope);
      ops::rope_forward(ctx, k, k, rope);
    }
    for (int64_t b = 0; b < B; ++b) {
      ops::copy(ctx, k_cache_[i].select(b).slice(length_, length_ + S), k.select(b));
      ops::copy(ctx, v_cache_[i].select(b).slice(length_, length_ + S), v.select(b));
    }
    Tensor core = ctx.empty({B, S, n, d}, dt);
    cached_attention(ctx, core, q, k_cache_[i], v_cache_[i], length_ + S, length_);
    Tensor proj = ctx.empty({B, S, h}, dt);
    nn::linear_forward(ctx, proj, core.view({B, S, n * d}), attn.linear_proj.weight,
                       attn.linear_proj.bias.defined() ? &attn.linear_proj.bias : nullptr);
    Tensor hidden = ctx.empty({B, S, h}, dt);
    ops::add(ctx, hidden, x, proj);

    Tensor ln2 = norm(ctx, layer.pre_mlp_layernorm, hidden);
    nn::MLP& mlp = layer.mlp;
    Tensor pre = ctx.empty({B, S, mlp.linear_fc1.out_features()}, dt);
    nn::linear_forward(ctx, pre, ln2, mlp.linear_fc1.weight, mlp.linear_fc1.bias.defined() ? &mlp.linear_fc1.bias : nullptr);
    Tensor act = ctx.empty({B, S, c.ffn()}, dt);
    if (c.args.swiglu) ops::swiglu_forward(ctx, act, pre);
    else ops::gelu_forward(ctx, act, pre);
    Tensor m = ctx.empty({B, S, h}, dt);
    nn::linear_forward(ctx, m, act, mlp.linear_fc2.weight, mlp.linear_fc2.bias.defined() ? &mlp.linear_fc2.bias : nullptr);
    Tensor next = ctx.empty({B, S, h}, dt);
    ops::add(ctx, next, hidden, m);
    x = next;
  }
  length_ += S;

  Tensor final_hidden = norm(ctx, model_.final_layernorm, x);
  Tensor logits = ctx.empty({B, S, c.padded_vocab_size}, dt);
  nn::linear_forward(ctx, logits.view({T, c.padded_vocab_size}), final_hidden.view({T, h}), model_.output_weight(), nullptr);
  if (dt == DType::F32) return logits;
  Tensor logits32 = ctx.empty(logits.shape(), DType::F32);
  ops::cast(ctx, logits32, logits);
  return logits32;
}

}  // namespace megatron::inference
