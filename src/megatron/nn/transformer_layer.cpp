#include "megatron/nn/transformer_layer.h"

#include "megatron/ops/dropout/dropout.h"

namespace megatron::nn {

void norm_of_stream(Context& ctx, Norm& norm, const Tensor& y, const ResidualStream& stream) {
  if (!stream.branch.defined()) {
    norm.forward(ctx, y, stream.residual);
    return;
  }
  Tensor sum = ctx.empty(stream.residual.shape(), stream.residual.dtype());
  norm.forward(ctx, y, sum, stream.branch, stream.residual);
}

TransformerLayer::TransformerLayer(Context& ctx, const std::string& prefix, const ModelConfig& config)
    : input_layernorm(ctx, prefix + ".input_layernorm", config),
      self_attention(ctx, prefix + ".self_attention", config),
      pre_mlp_layernorm(ctx, prefix + ".pre_mlp_layernorm", config),
      mlp(ctx, prefix + ".mlp", config),
      seed_(config.seed),
      dropout_p_(float(config.args.hidden_dropout)) {}

void TransformerLayer::init(Context& ctx, const ModelConfig& config) {
  input_layernorm.init(ctx);
  self_attention.init(ctx, config);
  pre_mlp_layernorm.init(ctx);
  mlp.init(ctx, config);
}

Tensor TransformerLayer::dropout_forward(Context& ctx, const Tensor& x, uint64_t offset) {
  if (active_p_ == 0.0f) return x;
  Tensor y = ctx.empty(x.shape(), x.dtype());
  ops::dropout_forward(ctx, y, x, active_p_, seed_, offset, 0);
  return y;
}

Tensor TransformerLayer::dropout_backward(Context& ctx, const Tensor& dy, uint64_t offset) {
  if (active_p_ == 0.0f) return dy;
  Tensor dx = ctx.empty(dy.shape(), dy.dtype());
  ops::dropout_backward(ctx, dx, dy, active_p_, seed_, offset, 0);
  return dx;
}

ResidualStream TransformerLayer::forward(Context& ctx, const ResidualStream& x, bool training,
                                         uint64_t dropout_offset) {
  const Shape shape = x.residual.shape();
  const DType dt = x.residual.dtype();
  dropout_offset_ = dropout_offset;
  active_p_ = training ? dropout_p_ : 0.0f;

  Tensor ln1 = ctx.empty(shape, dt);
  norm_of_stream(ctx, input_layernorm, ln1, x);  // saves the layer input x = residual + branch
  Tensor attn = ctx.empty(shape, dt);
  self_attention.forward(ctx, attn, ln1);

  // h = x + dropout(attn), formed by pre_mlp_layernorm's pass.
  const Tensor x_sum = input_layernorm.saved_input();
  Tensor h = ctx.empty(shape, dt), ln2 = ctx.empty(shape, dt);
  pre_mlp_layernorm.forward(ctx, ln2, h, dropout_forward(ctx, attn, dropout_offset + 0), x_sum);

  Tensor m = ctx.empty(shape, dt);
  mlp.forward(ctx, m, ln2);
  return ResidualStream{h, dropout_forward(ctx, m, dropout_offset + 1)};
}

void TransformerLayer::backward(Context& ctx, const Tensor& dx, const Tensor& dout) {
  const Shape shape = dout.shape();
  const DType dt = dout.dtype();

  Tensor dm = dropout_backward(ctx, dout, dropout_offset_ + 1);
  Tensor dln2 = ctx.empty(shape, dt);
  mlp.backward(ctx, dln2, dm);
  Tensor dh = ctx.empty(shape, dt);
  pre_mlp_layernorm.backward(ctx, dh, dln2, /*dresidual=*/dout);

  Tensor dattn = dropout_backward(ctx, dh, dropout_offset_ + 0);
  Tensor dln1 = ctx.empty(shape, dt);
  self_attention.backward(ctx, dln1, dattn);
  input_layernorm.backward(ctx, dx, dln1, /*dresidual=*/dh);
}

void TransformerLayer::collect_parameters(ParameterList& out) {
  input_layernorm.collect_parameters(out);
  self_attention.collect_parameters(out);
  pre_mlp_layernorm.collect_parameters(out);
  mlp.collect_parameters(out);
}

}  // namespace megatron::nn
