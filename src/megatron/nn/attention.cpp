#include "megatron/nn/attention.h"

#include "megatron/ops/attention/attention.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/rope/rope.h"

namespace megatron::nn {

SelfAttention::SelfAttention(Context& ctx, const std::string& name, const ModelConfig& config)
    : n_(config.heads()),
      g_(config.query_groups()),
      d_(config.head_dim()),
      rope_(config.position_embedding() == PositionEmbedding::Rope),
      rotary_percent_(config.args.rotary_percent),
      rotary_base_(config.args.rotary_base) {
  const int64_t qkv_rows = g_ * (n_ / g_ + 2) * d_;
  linear_qkv = Linear(ctx, name + ".linear_qkv", config.hidden(), qkv_rows, config.bias(), config.params_dtype);
  linear_proj = Linear(ctx, name + ".linear_proj", n_ * d_, config.hidden(), config.bias(), config.params_dtype);
}

void SelfAttention::init(Context& ctx, const ModelConfig& config) {
  linear_qkv.init(ctx, config.seed, config.args.init_method_std);
  linear_proj.init(ctx, config.seed, config.output_layer_init_std());
}

void SelfAttention::forward(Context& ctx, const Tensor& out, const Tensor& x) {
  const int64_t b = x.dim(0), s = x.dim(1), T = b * s, r = n_ / g_;
  const DType dt = x.dtype();
  Tensor qkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  linear_qkv.forward(ctx, qkv, x);

  // Split the fused projection (layout in the header).
  Tensor qkv_t = ctx.empty({(r + 2) * d_, T * g_}, dt);
  ops::transpose(ctx, qkv_t, qkv.view({T * g_, (r + 2) * d_}));
  q_ = ctx.empty({b, s, n_, d_}, dt);
  k_ = ctx.empty({b, s, g_, d_}, dt);
  v_ = ctx.empty({b, s, g_, d_}, dt);
  ops::transpose(ctx, q_.view({T * g_, r * d_}), qkv_t.slice(0, r * d_));
  ops::transpose(ctx, k_.view({T * g_, d_}), qkv_t.slice(r * d_, (r + 1) * d_));
  ops::transpose(ctx, v_.view({T * g_, d_}), qkv_t.slice((r + 1) * d_, (r + 2) * d_));

  if (rope_) {
    const ops::RopeOptions rope{.base = rotary_base_, .rotary_percent = rotary_percent_};
    ops::rope_forward(ctx, q_, q_, rope);
    ops::rope_forward(ctx, k_, k_, rope);
  }

  attn_out_ = ctx.empty({b, s, n_, d_}, dt);
  stats_ = ctx.empty({b, n_, s, 1}, DType::F32);
  ops::attention_forward(ctx, attn_out_, stats_, q_, k_, v_, {.causal = true});

  linear_proj.forward(ctx, out, attn_out_.view({b, s, n_ * d_}));
}

void SelfAttention::backward(Context& ctx, const Tensor& dx, const Tensor& dout) {
  MEGATRON_CHECK(q_.defined(), "SelfAttention: backward without a forward");
  const int64_t b = q_.dim(0), s = q_.dim(1), T = b * s, r = n_ / g_;
  const DType dt = q_.dtype();

  Tensor dattn = ctx.empty({b, s, n_, d_}, dt);
  linear_proj.backward(ctx, dattn.view({b, s, n_ * d_}), dout);

  Tensor dq = ctx.empty(q_.shape(), dt), dk = ctx.empty(k_.shape(), dt), dv = ctx.empty(v_.shape(), dt);
  ops::attention_backward(ctx, dq, dk, dv, dattn, q_, k_, v_, attn_out_, stats_, {.causal = true});

  if (rope_) {
    const ops::RopeOptions rope{.base = rotary_base_, .rotary_percent = rotary_percent_};
    ops::rope_backward(ctx, dq, dq, rope);
    ops::rope_backward(ctx, dk, dk, rope);
  }

  // Merge back into the fused layout: the inverse of the forward's split.
  Tensor dqkv_t = ctx.empty({(r + 2) * d_, T * g_}, dt);
  ops::transpose(ctx, dqkv_t.slice(0, r * d_), dq.view({T * g_, r * d_}));
  ops::transpose(ctx, dqkv_t.slice(r * d_, (r + 1) * d_), dk.view({T * g_, d_}));
  ops::transpose(ctx, dqkv_t.slice((r + 1) * d_, (r + 2) * d_), dv.view({T * g_, d_}));
  Tensor dqkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  ops::transpose(ctx, dqkv.view({T * g_, (r + 2) * d_}), dqkv_t);

  linear_qkv.backward(ctx, dx, dqkv);
  q_ = k_ = v_ = attn_out_ = stats_ = Tensor();
}

void SelfAttention::collect_parameters(ParameterList& out) {
  linear_qkv.collect_parameters(out);
  linear_proj.collect_parameters(out);
}

}  // namespace megatron::nn
