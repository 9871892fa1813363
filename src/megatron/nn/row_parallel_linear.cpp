#include "megatron/nn/row_parallel_linear.h"

#include "megatron/parallel/mappings.h"

namespace megatron::nn {

RowParallelLinear::RowParallelLinear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features,
                                     bool bias, DType dtype, const parallel::TensorParallel& tp,
                                     RowParallelOptions options)
    : tp_(tp), options_(options) {
  weight = make_parameter(ctx, name + ".weight", {out_features, in_features}, dtype, false,
                          {.dim = 1, .blocks = 1, .rank = tp.rank(), .size = tp.size()});
  if (bias)
    this->bias = make_parameter(ctx, name + ".bias", {out_features}, dtype, true,
                                {.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()});
}

void RowParallelLinear::init(Context& ctx, uint64_t seed, double std) {
  init_normal(ctx, weight, seed, std);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

void RowParallelLinear::forward(Context& ctx, const Tensor& y, const Tensor& x) {
  if (!tp_.enabled()) {
    linear_forward(ctx, y, x, weight, &bias);
    saved_x_ = x;
    return;
  }
  const int64_t rows = x.shape().rows(), in = in_features(), out = out_features();
  Tensor part = x;
  if (!options_.input_is_parallel) {
    part = ctx.empty({rows, in}, x.dtype());
    parallel::scatter_to_tp_forward(ctx, tp_, part, x.view({rows, x.shape().cols()}));
  }
  saved_x_ = part;
  const Parameter* once = tp_.rank() == 0 ? &bias : nullptr;  // the replicated bias, added by one rank
  if (!tp_.sp()) {
    linear_forward(ctx, y, part, weight, once);
    parallel::reduce_from_tp_forward(ctx, tp_, y);
    return;
  }
  Tensor partial = ctx.empty({rows, out}, x.dtype());
  linear_forward(ctx, partial, part, weight, once);
  parallel::reduce_scatter_to_sp_forward(ctx, tp_, y.view({-1, out}), partial);
}

void RowParallelLinear::backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& dx_gelu_input) {
  MEGATRON_CHECK(saved_x_.defined(), "RowParallelLinear ", weight.name, ": backward without a forward");
  if (!tp_.enabled()) {
    linear_backward(ctx, dx, dy, saved_x_, weight, &bias, dx_gelu_input);
    saved_x_ = Tensor();
    return;
  }
  const int64_t rows = saved_x_.shape().rows(), out = out_features();
  Tensor dwhole = dy;
  if (tp_.sp()) {
    dwhole = ctx.empty({rows, out}, dy.dtype());
    parallel::reduce_scatter_to_sp_backward(ctx, tp_, dwhole, dy.view({-1, out}));
  }
  if (dx.defined()) {
    if (options_.input_is_parallel) {
      linear_backward_input(ctx, dx, dwhole, weight, dx_gelu_input);
    } else {
      MEGATRON_CHECK(!dx_gelu_input.defined(), "RowParallelLinear ", weight.name,
                     ": the DGELU epilogue needs a parallel input");
      Tensor dpart = ctx.empty({rows, in_features()}, dy.dtype());
      linear_backward_input(ctx, dpart, dwhole, weight);
      parallel::scatter_to_tp_backward(ctx, tp_, dx.view({rows, dx.shape().cols()}), dpart);
    }
  }
  linear_backward_weight(ctx, dwhole, saved_x_, weight, &bias);
  saved_x_ = Tensor();
}

void RowParallelLinear::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
