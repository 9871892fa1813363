#include "megatron/nn/mlp.h"

#include "megatron/ops/activation/activation.h"

namespace megatron::nn {

namespace {
Shape with_last(const Shape& s, int64_t last) {
  std::vector<int64_t> dims = s.dims();
  dims.back() = last;
  return Shape(dims);
}
}  // namespace

MLP::MLP(Context& ctx, const std::string& name, const ModelConfig& config)
    : swiglu_(config.args.swiglu), ffn_(config.ffn()) {
  linear_fc1 = Linear(ctx, name + ".linear_fc1", config.hidden(), ffn_ * (swiglu_ ? 2 : 1), config.bias(),
                      config.params_dtype);
  linear_fc2 = Linear(ctx, name + ".linear_fc2", ffn_, config.hidden(), config.bias(), config.params_dtype);
}

void MLP::init(Context& ctx, const ModelConfig& config) {
  linear_fc1.init(ctx, config.seed, config.args.init_method_std);
  linear_fc2.init(ctx, config.seed, config.output_layer_init_std());
}

void MLP::forward(Context& ctx, const Tensor& out, const Tensor& x) {
  pre_act_ = ctx.empty(with_last(x.shape(), linear_fc1.out_features()), x.dtype());
  Tensor act = ctx.empty(with_last(x.shape(), ffn_), x.dtype());
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
    Tensor dact = ctx.empty(with_last(dout.shape(), ffn_), dout.dtype());
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
