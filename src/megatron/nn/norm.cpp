#include "megatron/nn/norm.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/norm/norm.h"
#include "megatron/parallel/mappings.h"

namespace megatron::nn {

Norm::Norm(Context& ctx, const std::string& name, const ModelConfig& config, const parallel::TensorParallel& tp)
    : tp_(tp), kind_(config.normalization()), eps_(float(config.args.norm_epsilon)), stats_dtype_(config.stats_dtype()) {
  const TensorParallelSplit replicated{.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()};
  weight = make_parameter(ctx, name + ".weight", {config.hidden()}, config.params_dtype, true, replicated);
  if (kind_ == Normalization::LayerNorm)
    bias = make_parameter(ctx, name + ".bias", {config.hidden()}, config.params_dtype, true, replicated);
}

void Norm::init(Context& ctx) {
  init_constant(ctx, weight, 1.0);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

void Norm::forward(Context& ctx, const Tensor& y, const Tensor& x) {
  const int64_t rows = x.shape().rows();
  rstd_ = ctx.empty({rows}, stats_dtype_);
  if (kind_ == Normalization::LayerNorm) {
    mean_ = ctx.empty({rows}, stats_dtype_);
    ops::layer_norm_forward(ctx, y, mean_, rstd_, x, weight.value, bias.value, eps_);
  } else {
    ops::rms_norm_forward(ctx, y, rstd_, x, weight.value, eps_);
  }
  saved_x_ = x;
}

void Norm::forward(Context& ctx, const Tensor& y, const Tensor& sum, const Tensor& x, const Tensor& residual) {
  const int64_t rows = x.shape().rows();
  rstd_ = ctx.empty({rows}, stats_dtype_);
  if (kind_ == Normalization::LayerNorm) {
    mean_ = ctx.empty({rows}, stats_dtype_);
    ops::layer_norm_forward(ctx, y, sum, mean_, rstd_, x, residual, weight.value, bias.value, eps_);
  } else {
    ops::rms_norm_forward(ctx, y, sum, rstd_, x, residual, weight.value, eps_);
  }
  saved_x_ = sum;
}

void Norm::backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& dresidual) {
  MEGATRON_CHECK(saved_x_.defined(), "Norm ", weight.name, ": backward without a forward");
  // Under sequence parallelism this rank's rows give a partial gradient: it accumulates like any other, and
  // GPTModel::finish_sequence_parallel_grads sums it over TP once per iteration (Megatron's
  // _allreduce_layernorm_grads), after the data-parallel reduction (both are sums: the order is free).
  if (kind_ == Normalization::LayerNorm)
    ops::layer_norm_backward(ctx, dx, weight.main_grad, bias.main_grad, dy, saved_x_, weight.value, mean_, rstd_,
                             true, dresidual);
  else
    ops::rms_norm_backward(ctx, dx, weight.main_grad, dy, saved_x_, weight.value, rstd_, true, dresidual);
  saved_x_ = mean_ = rstd_ = Tensor();
}

void Norm::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
