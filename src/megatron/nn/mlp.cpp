#include "megatron/nn/mlp.h"

#include "megatron/ops/activation/activation.h"

namespace megatron::nn {

MLP::MLP(Context& ctx, const std::string& name, const ModelConfig& config, const parallel::TensorParallel& tp)
    : tp_(tp), swiglu_(config.args.swiglu), ffn_(config.ffn() / tp.size()) {
  MEGATRON_CHECK(config.ffn() % tp.size() == 0, "MLP ", name, ": --ffn-hidden-size ", config.ffn(),
                 " must be divisible by TP ", tp.size());
  const int blocks = swiglu_ ? 2 : 1;
  linear_fc1 = ColumnParallelLinear(ctx, name + ".linear_fc1", config.hidden(), config.ffn() * blocks, config.bias(),
                                    config.params_dtype, tp, {.gather_output = false, .blocks = blocks});
  linear_fc2 = RowParallelLinear(ctx, name + ".linear_fc2", config.ffn(), config.hidden(), config.bias(),
                                 config.params_dtype, tp);
}

void MLP::init(Context& ctx, const ModelConfig& config) {
  linear_fc1.init(ctx, config.seed, config.args.init_method_std);
  linear_fc2.init(ctx, config.seed, config.output_layer_init_std());
}

void MLP::forward(Context& ctx, const Tensor& out, const Tensor& x) {
  // Every token row after the column-parallel layer's gather (sequence parallelism), this rank's columns.
  const int64_t rows = x.shape().rows() * (tp_.sp() ? tp_.size() : 1);
  pre_act_ = ctx.empty({rows, linear_fc1.out_features()}, x.dtype());
  Tensor act = ctx.empty({rows, ffn_}, x.dtype());
  if (swiglu_) {
    linear_fc1.forward(ctx, pre_act_, x);
    ops::swiglu_forward(ctx, act, pre_act_);
  } else {
    linear_fc1.forward(ctx, act, x, /*gelu_input_out=*/pre_act_);  // GELU in the gemm's epilogue
  }
  linear_fc2.forward(ctx, out, act);
}

void MLP::backward(Context& ctx, const Tensor& dx, const Tensor& dout) {
  MEGATRON_CHECK(pre_act_.defined(), "MLP: backward without a forward");
  Tensor dpre = ctx.empty(pre_act_.shape(), pre_act_.dtype());
  if (swiglu_) {
    Tensor dact = ctx.empty({pre_act_.dim(0), ffn_}, dout.dtype());
    linear_fc2.backward(ctx, dact, dout);
    ops::swiglu_backward(ctx, dpre, dact, pre_act_);
  } else {
    linear_fc2.backward(ctx, dpre, dout, /*dx_gelu_input=*/pre_act_);  // GELU's backward in the gemm's epilogue
  }
  linear_fc1.backward(ctx, dx, dpre);
  pre_act_ = Tensor();
}

void MLP::collect_parameters(ParameterList& out) {
  linear_fc1.collect_parameters(out);
  linear_fc2.collect_parameters(out);
}

}  // namespace megatron::nn
