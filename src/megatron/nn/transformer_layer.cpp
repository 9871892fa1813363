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

TransformerLayer::TransformerLayer(Context& ctx, const std::string& prefix, const ModelConfig& config,
                                   const parallel::TensorParallel& tp)
    : input_layernorm(ctx, prefix + ".input_layernorm", config, tp),
      self_attention(ctx, prefix + ".self_attention", config, tp),
      pre_mlp_layernorm(ctx, prefix + ".pre_mlp_layernorm", config, tp),
      mlp(ctx, prefix + ".mlp", config, tp),
      tp_(tp),
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
  ops::dropout_forward(ctx, y, x, active_p_, seed_, offset, dropout_index_base_);
  return y;
}

Tensor TransformerLayer::dropout_backward(Context& ctx, const Tensor& dy, uint64_t offset) {
  if (active_p_ == 0.0f) return dy;
  Tensor dx = ctx.empty(dy.shape(), dy.dtype());
  ops::dropout_backward(ctx, dx, dy, active_p_, seed_, offset, dropout_index_base_);
  return dx;
}

ResidualStream TransformerLayer::forward(Context& ctx, const ResidualStream& x, bool training,
                                         uint64_t dropout_offset, int64_t seq) {
  const Shape shape = x.residual.shape();
  const DType dt = x.residual.dtype();
  if (seq == 0) {
    MEGATRON_CHECK(shape.rank() == 3, "TransformerLayer: x ", x.residual.describe(),
                   " must be [b, s, h] when no sequence length is given");
    seq = shape[1];
  }
  dropout_offset_ = dropout_offset;
  // Under sequence parallelism this rank's rows are rows [rank * rows, (rank + 1) * rows) of the whole.
  dropout_index_base_ = tp_.sp() ? uint64_t(tp_.rank()) * uint64_t(shape.numel()) : 0;
  active_p_ = training ? dropout_p_ : 0.0f;

  Tensor ln1 = ctx.empty(shape, dt);
  norm_of_stream(ctx, input_layernorm, ln1, x);  // saves the layer input x = residual + branch
  Tensor attn = ctx.empty(shape, dt);
  self_attention.forward(ctx, attn, ln1, seq);

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
