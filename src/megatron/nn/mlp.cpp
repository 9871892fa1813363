#include "megatron/nn/mlp.h"


namespace megatron::nn {

MLP::MLP(Context& ctx, const std::string& name, const TransformerConfig& config, const parallel::TensorParallel& tp)
    : tp_(tp), swiglu_(config.swiglu), ffn_(config.ffn() / tp.size()) {
  MEGATRON_CHECK(config.ffn() % tp.size() == 0, "MLP ", name, ": --ffn-hidden-size ", config.ffn(),
                 " must be divisible by TP ", tp.size());
  const int blocks = swiglu_ ? 2 : 1;
  linear_fc1 = ColumnParallelLinear(ctx, name + ".linear_fc1", config.hidden(), config.ffn() * blocks, config.bias(),
                                    config.params_dtype, tp, {.gather_output = false, .blocks = blocks});
  linear_fc2 = RowParallelLinear(ctx, name + ".linear_fc2", config.ffn(), config.hidden(), config.bias(),
                                 config.params_dtype, tp);
}

void MLP::init(Context& ctx, const TransformerConfig& config) {
  linear_fc1.init(ctx, config.seed, config.init_method_std);
  linear_fc2.init(ctx, config.seed, config.output_layer_init_std());
}

MLPSaved MLP::forward(Context& ctx, const Tensor& out, const Tensor& x) const {
  // Every token row after the column-parallel layer's gather (sequence parallelism), this rank's columns.
  const int64_t rows = x.shape().rows() * (tp_.sp() ? tp_.size() : 1);
  MLPSaved saved;
  saved.pre_act = ctx.empty({rows, linear_fc1.out_features()}, x.dtype());
  if (swiglu_) {
    // SwiGLU's output as fc2's produced input: an FP8 fc2 computes it inside its cast, else it is stored first.
    saved.fc1 = linear_fc1.forward(ctx, saved.pre_act, x);
    saved.fc2 = linear_fc2.forward(ctx, out, LinearOperand::swiglu(saved.pre_act));
    return saved;
  }
  Tensor act = ctx.empty({rows, ffn_}, x.dtype());
  saved.fc1 = linear_fc1.forward(ctx, act, x, /*gelu_input_out=*/saved.pre_act);  // GELU in the gemm's epilogue
  saved.fc2 = linear_fc2.forward(ctx, out, act);
  return saved;
}

void MLP::backward(Context& ctx, MLPSaved&& saved, const Tensor& dx, const Tensor& dout) {
  MLPSaved m = std::move(saved);
  MEGATRON_CHECK(m.pre_act.defined(), "MLP: backward without a forward's saved state");
  if (swiglu_) {
    // SwiGLU's input gradient as fc1's produced output gradient: an FP8 fc1 computes it inside its cast;
    // otherwise it is stored here, so that the pre-activation is freed before fc1's GEMMs, as before.
    Tensor dact = ctx.empty({m.pre_act.dim(0), ffn_}, dout.dtype());
    linear_fc2.backward(ctx, std::move(m.fc2), dact, dout);
    LinearOperand dpre = LinearOperand::swiglu_grad(std::move(dact), std::move(m.pre_act));
    if (!linear_fc1.fp8()) dpre = dpre.materialise(ctx);
    linear_fc1.backward(ctx, std::move(m.fc1), dx, std::move(dpre));
    return;
  }
  Tensor dpre = ctx.empty(m.pre_act.shape(), m.pre_act.dtype());
  linear_fc2.backward(ctx, std::move(m.fc2), dpre, dout, /*dx_gelu_input=*/m.pre_act);  // GELU's backward in the gemm
  m.pre_act = Tensor();
  linear_fc1.backward(ctx, std::move(m.fc1), dx, dpre);
}

void MLP::collect_parameters(ParameterList& out) {
  linear_fc1.collect_parameters(out);
  linear_fc2.collect_parameters(out);
}

}  // namespace megatron::nn
