#include "megatron/ops/norm/norm.h"

#include <cmath>

#include "megatron/ops/norm/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/norm/cuda.h"
#endif

namespace megatron::ops {
namespace {

void check_activation_dtype(OpCheck& check, const Context& ctx, const char* name, const Tensor& x) {
  if (ctx.is_cuda()) check.dtype_in(name, x, {DType::F32, DType::BF16, DType::F16});
  else check.dtype_in(name, x, {DType::F64, DType::F32, DType::BF16, DType::F16});
}

// Statistics and weight gradients are F32; F64 inputs may use F64 ones (fp64 gradient checks).
void check_f32_or_f64(OpCheck& check, const char* name, const Tensor& t, const Tensor& x) {
  if (x.dtype() == DType::F64) check.dtype_in(name, t, {DType::F32, DType::F64});
  else check.dtype(name, t, DType::F32);
}

void check_params(OpCheck& check, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  int64_t h = x.shape().cols();
  check.shape("weight", weight, Shape{h}).dtype_in("weight", weight, {x.dtype(), DType::F32});
  if (bias.defined()) check.shape("bias", bias, Shape{h}).same_dtype({{"weight", weight}, {"bias", bias}});
}

void check_x(OpCheck& check, const Context& ctx, const Tensor& x) {
  check.that(x.rank() >= 1, "argument x is ", x.describe(), " but must have rank >= 1");
  check.that(x.shape().cols() >= 1, "argument x is ", x.describe(), " but its last extent (hidden) must be >= 1");
  check_activation_dtype(check, ctx, "x", x);
}

void norm_forward_impl(const char* op, Context& ctx, bool rms, const Tensor& y, const Tensor& residual_out,
                       const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& residual,
                       const Tensor& weight, const Tensor& bias, float eps) {
  OpCheck check(op);
  check.device(ctx, {{"y", y}, {"rstd", rstd}, {"x", x}, {"weight", weight}});
  if (!rms) check.device(ctx, {{"mean", mean}});
  if (bias.defined()) check.device(ctx, {{"bias", bias}});
  if (residual.defined() || residual_out.defined())
    check.device(ctx, {{"residual", residual}, {"residual_out", residual_out}});
  check_x(check, ctx, x);
  check.shape("y", y, x.shape()).dtype("y", y, x.dtype());
  if (residual.defined()) {
    check.shape("residual", residual, x.shape()).dtype("residual", residual, x.dtype());
    check.shape("residual_out", residual_out, x.shape()).dtype("residual_out", residual_out, x.dtype());
  }
  check_params(check, x, weight, bias);
  Shape stats{x.shape().rows()};
  check.shape("rstd", rstd, stats);
  check_f32_or_f64(check, "rstd", rstd, x);
  if (!rms) {
    check.shape("mean", mean, stats).same_dtype({{"rstd", rstd}, {"mean", mean}});
  }
  check.that(std::isfinite(eps) && eps >= 0, "eps must be finite and >= 0, got ", eps);

  MEGATRON_DISPATCH(ctx,
                    cuda::norm_forward(ctx, rms, y, residual_out, mean, rstd, x, residual, weight, bias, eps),
                    cpu::norm_forward(rms, y, residual_out, mean, rstd, x, residual, weight, bias, eps));
}

void norm_backward_impl(const char* op, Context& ctx, bool rms, const Tensor& dx, const Tensor& dweight,
                        const Tensor& dbias, const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool accumulate, const Tensor& dresidual) {
  OpCheck check(op);
  check.device(ctx, {{"dx", dx}, {"dweight", dweight}, {"dy", dy}, {"x", x}, {"weight", weight}, {"rstd", rstd}});
  if (!rms) check.device(ctx, {{"mean", mean}});
  if (dbias.defined()) check.device(ctx, {{"dbias", dbias}});
  if (dresidual.defined()) check.device(ctx, {{"dresidual", dresidual}});
  check_x(check, ctx, x);
  check.shape("dx", dx, x.shape()).dtype("dx", dx, x.dtype());
  check.shape("dy", dy, x.shape()).dtype("dy", dy, x.dtype());
  if (dresidual.defined()) check.shape("dresidual", dresidual, x.shape()).dtype("dresidual", dresidual, x.dtype());
  check_params(check, x, weight, Tensor());
  int64_t h = x.shape().cols();
  check.shape("dweight", dweight, Shape{h});
  check_f32_or_f64(check, "dweight", dweight, x);
  if (dbias.defined()) check.shape("dbias", dbias, Shape{h}).same_dtype({{"dweight", dweight}, {"dbias", dbias}});
  Shape stats{x.shape().rows()};
  check.shape("rstd", rstd, stats);
  check_f32_or_f64(check, "rstd", rstd, x);
  if (!rms) check.shape("mean", mean, stats).same_dtype({{"rstd", rstd}, {"mean", mean}});

  MEGATRON_DISPATCH(ctx,
                    cuda::norm_backward(ctx, rms, dx, dweight, dbias, dy, x, weight, mean, rstd, accumulate, dresidual),
                    cpu::norm_backward(rms, dx, dweight, dbias, dy, x, weight, mean, rstd, accumulate, dresidual));
}

}  // namespace

void layer_norm_forward(Context& ctx, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, float eps) {
  norm_forward_impl("layer_norm_forward", ctx, false, y, Tensor(), mean, rstd, x, Tensor(), weight, bias, eps);
}

void layer_norm_forward(Context& ctx, const Tensor& y, const Tensor& residual_out, const Tensor& mean,
                        const Tensor& rstd, const Tensor& x, const Tensor& residual, const Tensor& weight,
                        const Tensor& bias, float eps) {
  OpCheck("layer_norm_forward").defined("residual", residual).defined("residual_out", residual_out);
  norm_forward_impl("layer_norm_forward", ctx, false, y, residual_out, mean, rstd, x, residual, weight, bias, eps);
}

void rms_norm_forward(Context& ctx, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      float eps) {
  norm_forward_impl("rms_norm_forward", ctx, true, y, Tensor(), Tensor(), rstd, x, Tensor(), weight, Tensor(), eps);
}

void rms_norm_forward(Context& ctx, const Tensor& y, const Tensor& residual_out, const Tensor& rstd,
                      const Tensor& x, const Tensor& residual, const Tensor& weight, float eps) {
  OpCheck("rms_norm_forward").defined("residual", residual).defined("residual_out", residual_out);
  norm_forward_impl("rms_norm_forward", ctx, true, y, residual_out, Tensor(), rstd, x, residual, weight, Tensor(),
                    eps);
}

void layer_norm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, bool accumulate_weight_grads, const Tensor& dresidual) {
  norm_backward_impl("layer_norm_backward", ctx, false, dx, dweight, dbias, dy, x, weight, mean, rstd,
                     accumulate_weight_grads, dresidual);
}

void rms_norm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& weight, const Tensor& rstd, bool accumulate_weight_grads,
                       const Tensor& dresidual) {
  norm_backward_impl("rms_norm_backward", ctx, true, dx, dweight, Tensor(), dy, x, weight, Tensor(), rstd,
                     accumulate_weight_grads, dresidual);
}

}  // namespace megatron::ops
