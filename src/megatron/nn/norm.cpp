#include "megatron/nn/norm.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/norm/norm.h"
#include "megatron/parallel/mappings.h"

namespace megatron::nn {

Norm::Norm(Context& ctx, const std::string& name, const TransformerConfig& config, const parallel::TensorParallel& tp,
           NormShape shape)
    : tp_(tp),
      zero_centered_(config.norm_zero_centered_gamma),
      kind_(config.normalization),
      eps_(float(config.norm_epsilon)),
      stats_dtype_(config.stats_dtype()) {
  // Replicated over TP; under sequence parallelism each rank's gradient covers its token rows only, and a
  // per-head norm's covers this rank's heads only.
  const Placement replicated{.tp = {.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()},
                             .grad_partial_over_tp = shape.per_head ? tp.size() > 1 : tp.sp()};
  const int64_t width = shape.per_head ? shape.width : config.hidden();
  weight = make_parameter(ctx, name + ".weight", {width}, config.params_dtype, true, replicated);
  if (kind_ == Normalization::LayerNorm)
    bias = make_parameter(ctx, name + ".bias", {width}, config.params_dtype, true, replicated);
}

void Norm::init(Context& ctx) {
  init_constant(ctx, weight, zero_centered_ ? 0.0 : 1.0);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

Norm::Affine Norm::affine(Context& ctx) const {
  if (!zero_centered_) return {weight.value, bias.value};
  const DType dtype = weight.value.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Affine a{ctx.empty(weight.value.shape(), dtype), Tensor()};
  Tensor ones = ctx.empty(weight.value.shape(), dtype);
  ops::cast(ctx, a.scale, weight.value);
  ops::fill(ctx, ones, 1.0);
  ops::add(ctx, a.scale, a.scale, ones);
  if (bias.defined()) {
    a.bias = ctx.empty(bias.value.shape(), dtype);
    ops::cast(ctx, a.bias, bias.value);
  }
  return a;
}

NormSaved Norm::forward(Context& ctx, const Tensor& y, const Tensor& x) const {
  const int64_t rows = x.shape().rows();
  NormSaved saved{.x = x, .mean = Tensor(), .rstd = ctx.empty({rows}, stats_dtype_)};
  if (kind_ == Normalization::LayerNorm) {
    saved.mean = ctx.empty({rows}, stats_dtype_);
    const Affine a = affine(ctx);
    ops::layer_norm_forward(ctx, y, saved.mean, saved.rstd, x, a.scale, a.bias, eps_);
  } else {
    ops::rms_norm_forward(ctx, y, saved.rstd, x, affine(ctx).scale, eps_);
  }
  return saved;
}

NormSaved Norm::forward(Context& ctx, const Tensor& y, const Tensor& sum, const Tensor& x,
                        const Tensor& residual) const {
  const int64_t rows = x.shape().rows();
  NormSaved saved{.x = sum, .mean = Tensor(), .rstd = ctx.empty({rows}, stats_dtype_)};
  if (kind_ == Normalization::LayerNorm) {
    saved.mean = ctx.empty({rows}, stats_dtype_);
    const Affine a = affine(ctx);
    ops::layer_norm_forward(ctx, y, sum, saved.mean, saved.rstd, x, residual, a.scale, a.bias, eps_);
  } else {
    ops::rms_norm_forward(ctx, y, sum, saved.rstd, x, residual, affine(ctx).scale, eps_);
  }
  return saved;
}

void Norm::backward(Context& ctx, NormSaved&& saved, const Tensor& dx, const Tensor& dy, const Tensor& dresidual) {
  const NormSaved s = std::move(saved);
  MEGATRON_CHECK(s.x.defined(), "Norm ", weight.name, ": backward without a forward's saved input");
  // Under sequence parallelism this rank's rows give a partial gradient: it accumulates like any other, and
  // finalize_model_grads sums it over TP once per iteration (Megatron's _allreduce_layernorm_grads), after
  // the data-parallel reduction (both are sums: the order is free).
  // With a zero-centred weight the gradient of 1 + w is w's: the kernels accumulate it into weight.main_grad.
  const Tensor scale = affine(ctx).scale;
  if (kind_ == Normalization::LayerNorm)
    ops::layer_norm_backward(ctx, dx, weight.main_grad, bias.main_grad, dy, s.x, scale, s.mean, s.rstd, true,
                             dresidual);
  else
    ops::rms_norm_backward(ctx, dx, weight.main_grad, dy, s.x, scale, s.rstd, true, dresidual);
}

void Norm::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
