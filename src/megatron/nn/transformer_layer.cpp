#include "megatron/nn/transformer_layer.h"


namespace megatron::nn {

NormSaved norm_of_stream(Context& ctx, const Norm& norm, const Tensor& y, const ResidualStream& stream) {
  if (!stream.branch.defined()) return norm.forward(ctx, y, stream.residual);
  Tensor sum = ctx.empty(stream.residual.shape(), stream.residual.dtype());
  return norm.forward(ctx, y, sum, stream.branch, stream.residual);
}

TransformerLayer::TransformerLayer(Context& ctx, const std::string& prefix, const TransformerConfig& config,
                                   const parallel::TensorParallel& tp, const parallel::ContextParallel& cp, int layer,
                                   const MoeParallel& moe_parallel)
    : input_layernorm(ctx, prefix + ".input_layernorm", config, tp),
      self_attention(ctx, prefix + ".self_attention", config, tp, cp, layer),
      pre_mlp_layernorm(ctx, prefix + ".pre_mlp_layernorm", config, tp),
      tp_(tp),
      cp_(cp),
      seed_(config.seed),
      dropout_p_(float(config.hidden_dropout)),
      recompute_mlp_(config.recompute.selective_mlp()),
      recompute_moe_(config.recompute.selective_moe()),
      recompute_norms_(config.recompute.selective_layernorm()) {
  if (config.moe.is_moe_layer(layer)) moe = MoELayer(ctx, prefix + ".mlp", config, tp, moe_parallel);
  else mlp = MLP(ctx, prefix + ".mlp", config, tp);
}

void TransformerLayer::init(Context& ctx, const TransformerConfig& config) {
  input_layernorm.init(ctx);
  self_attention.init(ctx, config);
  pre_mlp_layernorm.init(ctx);
  if (moe.defined()) moe.init(ctx, config);
  else mlp.init(ctx, config);
}

Tensor TransformerLayer::dropout_forward(Context& ctx, const Tensor& x, const DropoutSites& sites,
                                         uint64_t site) const {
  if (sites.rows.p == 0.0f) return x;
  Tensor y = ctx.empty(x.shape(), x.dtype());
  DropoutRows rows = sites.rows;
  rows.offset += site;
  dropout_rows_forward(ctx, y, x, rows);
  return y;
}

Tensor TransformerLayer::dropout_backward(Context& ctx, const Tensor& dy, const DropoutSites& sites,
                                          uint64_t site) const {
  if (sites.rows.p == 0.0f) return dy;
  Tensor dx = ctx.empty(dy.shape(), dy.dtype());
  DropoutRows rows = sites.rows;
  rows.offset += site;
  dropout_rows_backward(ctx, dx, dy, rows);
  return dx;
}

TransformerLayerSaved TransformerLayer::forward(Context& ctx, ResidualStream& out, const ResidualStream& x,
                                                const LayerPass& pass) const {
  const Shape shape = x.residual.shape();
  const DType dt = x.residual.dtype();
  int64_t seq = pass.seq;
  if (seq == 0) {
    MEGATRON_CHECK(shape.rank() == 3, "TransformerLayer: x ", x.residual.describe(),
                   " must be [b, s, h] when no sequence length is given");
    seq = shape[1];
  }
  TransformerLayerSaved saved;
  if (pass.training && dropout_p_ > 0.0f) {
    const int64_t batch = shape.rows() * (tp_.sp() ? tp_.size() : 1) / seq;
    saved.dropout.rows = {.p = dropout_p_, .seed = seed_, .offset = pass.dropout_offset,
                          .runs = activation_rows(tp_, cp_, batch, seq)};
  }

  Tensor ln1 = ctx.empty(shape, dt);
  saved.input_norm = norm_of_stream(ctx, input_layernorm, ln1, x);  // saves the layer input x = residual + branch
  Tensor attn = ctx.empty(shape, dt);
  saved.attention = self_attention.forward(ctx, attn, ln1, seq, pass.kv_cache, pass.position, pass.positions,
                                           pass.cu_seqlens,
                                           pass.training ? std::optional(pass.attention_dropout_offset) : std::nullopt);
  if (recompute_norms_ && pass.training && saved.attention.qkv_input.x.defined()) {  // the backward normalises again
    saved.attention.qkv_input.x = Tensor();
    saved.input_norm_dropped = true;
  }

  // h = x + dropout(attn), formed by pre_mlp_layernorm's pass.
  Tensor h = ctx.empty(shape, dt), ln2 = ctx.empty(shape, dt);
  saved.pre_mlp_norm =
      pre_mlp_layernorm.forward(ctx, ln2, h, dropout_forward(ctx, attn, saved.dropout, 0), saved.input_norm.x);

  Tensor m = ctx.empty(shape, dt);
  if (moe.defined()) {
    const int64_t all_rows = shape.rows() * (tp_.sp() ? tp_.size() : 1);
    const TokenRows rows{.seq = seq, .first_row = tp_.sp_row_offset(all_rows), .total_rows = all_rows};
    saved.moe = moe.forward(ctx, m, ln2, pass.training, rows, pass.timers, pass.recomputing);
    saved.moe_loss_grad_scale = pass.moe_loss_grad_scale;
    if (recompute_moe_ && pass.training) {  // keep the input only; the backward runs the MoE layer again
      saved.moe = MoESaved();
      saved.mlp_input = ln2;
      saved.moe_rows = rows;
    }
  } else {
    saved.mlp = mlp.forward(ctx, m, ln2);
    if (recompute_mlp_ && pass.training) {  // keep the input only; the backward runs the MLP again
      saved.mlp = MLPSaved();
      saved.mlp_input = ln2;
    }
    if (recompute_norms_ && pass.training && (saved.mlp_input.defined() || saved.mlp.fc1.x.defined())) {
      saved.mlp_input = Tensor();  // (with mlp: the input the MLP runs again from)
      saved.mlp.fc1.x = Tensor();
      saved.pre_mlp_norm_dropped = true;
    }
  }
  out = ResidualStream{h, dropout_forward(ctx, m, saved.dropout, 1)};
  return saved;
}

void TransformerLayer::backward(Context& ctx, TransformerLayerSaved&& saved, const Tensor& dx, const Tensor& dout) {
  TransformerLayerSaved s = std::move(saved);
  const Shape shape = dout.shape();
  const DType dt = dout.dtype();

  Tensor dm = dropout_backward(ctx, dout, s.dropout, 1);
  Tensor dln2 = ctx.empty(shape, dt);
  if (s.pre_mlp_norm_dropped) {  // the pre-MLP norm's output again, from its saved input (the same kernel and bits)
    Tensor ln2 = ctx.empty(s.pre_mlp_norm.x.shape(), dt);
    static_cast<void>(pre_mlp_layernorm.forward(ctx, ln2, s.pre_mlp_norm.x));
    if (recompute_mlp_) s.mlp_input = ln2;
    else s.mlp.fc1.x = ln2;
  }
  if (s.mlp_input.defined() && !moe.defined()) {  // selective mlp: the MLP's forward again (its output unused)
    Tensor unused = ctx.empty(shape, dt);
    s.mlp = mlp.forward(ctx, unused, s.mlp_input);
    s.mlp_input = Tensor();
  }
  if (moe.defined() && s.mlp_input.defined()) {  // selective "moe": the layer's forward again, recording nothing
    Tensor unused = ctx.empty(shape, dt);
    s.moe = moe.forward(ctx, unused, s.mlp_input, /*training=*/true, s.moe_rows, nullptr, /*recomputing=*/true);
    s.mlp_input = Tensor();
  }
  if (moe.defined()) moe.backward(ctx, std::move(s.moe), dln2, dm, s.moe_loss_grad_scale);
  else mlp.backward(ctx, std::move(s.mlp), dln2, dm);
  Tensor dh = ctx.empty(shape, dt);
  pre_mlp_layernorm.backward(ctx, std::move(s.pre_mlp_norm), dh, dln2, /*dresidual=*/dout);

  Tensor dattn = dropout_backward(ctx, dh, s.dropout, 0);
  Tensor dln1 = ctx.empty(shape, dt);
  if (s.input_norm_dropped) {  // QKV's input again, from the input norm's saved input
    s.attention.qkv_input.x = ctx.empty(s.input_norm.x.shape(), dt);
    static_cast<void>(input_layernorm.forward(ctx, s.attention.qkv_input.x, s.input_norm.x));
  }
  self_attention.backward(ctx, std::move(s.attention), dln1, dattn);
  input_layernorm.backward(ctx, std::move(s.input_norm), dx, dln1, /*dresidual=*/dh);
}

void TransformerLayer::enable_fp8(const std::shared_ptr<Fp8ScalingState>& state) {
  comm::Communicator* sequence = cp_.group.get();
  self_attention.linear_qkv.enable_fp8(state, sequence);
  self_attention.linear_proj.enable_fp8(state, sequence);
  if (moe.defined()) return;
  mlp.linear_fc1.enable_fp8(state, sequence);
  mlp.linear_fc2.enable_fp8(state, sequence);
}

void TransformerLayer::collect_parameters(ParameterList& out) {
  input_layernorm.collect_parameters(out);
  self_attention.collect_parameters(out);
  pre_mlp_layernorm.collect_parameters(out);
  if (moe.defined()) moe.collect_parameters(out);
  else mlp.collect_parameters(out);
}

}  // namespace megatron::nn
