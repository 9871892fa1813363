#include "megatron/nn/attention.h"

#include "megatron/ops/attention/attention.h"
#include "megatron/ops/qkv/qkv.h"

namespace megatron::nn {

SelfAttention::SelfAttention(Context& ctx, const std::string& name, const ModelConfig& config,
                             const parallel::TensorParallel& tp)
    : tp_(tp),
      n_(config.heads() / tp.size()),
      g_(config.query_groups() / tp.size()),
      d_(config.head_dim()),
      rope_(config.position_embedding() == PositionEmbedding::Rope),
      deterministic_(config.deterministic),
      rotary_percent_(config.args.rotary_percent),
      rotary_base_(config.args.rotary_base) {
  MEGATRON_CHECK(config.heads() % tp.size() == 0 && config.query_groups() % tp.size() == 0, "SelfAttention ", name,
                 ": ", config.heads(), " heads and ", config.query_groups(), " query groups must be divisible by TP ",
                 tp.size());
  const int64_t P = tp.size(), qkv_rows = P * g_ * (n_ / g_ + 2) * d_;
  linear_qkv = ColumnParallelLinear(ctx, name + ".linear_qkv", config.hidden(), qkv_rows, config.bias(),
                                    config.params_dtype, tp);
  linear_proj = RowParallelLinear(ctx, name + ".linear_proj", P * n_ * d_, config.hidden(), config.bias(),
                                  config.params_dtype, tp);
}

void SelfAttention::init(Context& ctx, const ModelConfig& config) {
  linear_qkv.init(ctx, config.seed, config.args.init_method_std);
  linear_proj.init(ctx, config.seed, config.output_layer_init_std());
}

std::optional<ops::RopeOptions> SelfAttention::rope() const {
  if (!rope_) return std::nullopt;
  return ops::RopeOptions{.base = rotary_base_, .rotary_percent = rotary_percent_};
}

void SelfAttention::forward(Context& ctx, const Tensor& out, const Tensor& x, int64_t seq) {
  if (seq == 0) {
    MEGATRON_CHECK(x.rank() == 3, "SelfAttention: x ", x.describe(), " must be [b, s, h] when no sequence length is given");
    seq = x.dim(1);
  }
  const int64_t tokens = x.shape().rows() * (tp_.sp() ? tp_.size() : 1);  // whole sequences after the gather
  MEGATRON_CHECK(seq > 0 && tokens % seq == 0, "SelfAttention: ", tokens, " token rows are not whole sequences of ", seq);
  const int64_t b = tokens / seq, s = seq, r = n_ / g_;
  const DType dt = x.dtype();
  Tensor qkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  linear_qkv.forward(ctx, qkv, x);

  attn_out_ = ctx.empty({b, s, n_, d_}, dt);
  stats_ = ctx.empty({b, n_, s, 1}, DType::F32);
  if (packed()) {  // MHA without RoPE: the attention reads q, k, v inside the fused projection's output
    qkv_ = qkv;
    ops::attention_forward_packed(ctx, attn_out_, stats_, qkv, {.causal = true});
  } else {
    // Split the fused projection into heads, rotating q and k on the way (layout in ops/qkv/qkv.h).
    q_ = ctx.empty({b, s, n_, d_}, dt);
    k_ = ctx.empty({b, s, g_, d_}, dt);
    v_ = ctx.empty({b, s, g_, d_}, dt);
    ops::split_qkv_forward(ctx, q_, k_, v_, qkv, rope());
    ops::attention_forward(ctx, attn_out_, stats_, q_, k_, v_, {.causal = true});
  }

  linear_proj.forward(ctx, out, attn_out_.view({b, s, n_ * d_}));
}

void SelfAttention::backward(Context& ctx, const Tensor& dx, const Tensor& dout) {
  MEGATRON_CHECK(attn_out_.defined(), "SelfAttention: backward without a forward");
  const int64_t b = attn_out_.dim(0), s = attn_out_.dim(1), r = n_ / g_;
  const DType dt = attn_out_.dtype();
  const ops::AttentionOptions options{.causal = true, .deterministic = deterministic_};

  Tensor dattn = ctx.empty({b, s, n_, d_}, dt);
  linear_proj.backward(ctx, dattn.view({b, s, n_ * d_}), dout);

  Tensor dqkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  if (packed()) {
    ops::attention_backward_packed(ctx, dqkv, dattn, qkv_, attn_out_, stats_, options);
  } else {
    Tensor dq = ctx.empty(q_.shape(), dt), dk = ctx.empty(k_.shape(), dt), dv = ctx.empty(v_.shape(), dt);
    ops::attention_backward(ctx, dq, dk, dv, dattn, q_, k_, v_, attn_out_, stats_, options);
    // Rotate dq and dk back and pack the three into the fused layout (the split's transpose).
    ops::merge_qkv_backward(ctx, dqkv, dq, dk, dv, rope());
  }

  linear_qkv.backward(ctx, dx, dqkv);
  qkv_ = q_ = k_ = v_ = attn_out_ = stats_ = Tensor();
}

void SelfAttention::collect_parameters(ParameterList& out) {
  linear_qkv.collect_parameters(out);
  linear_proj.collect_parameters(out);
}

}  // namespace megatron::nn
