#include "megatron/nn/linear.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::nn {

void linear_forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight, const Parameter* bias) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  ops::GemmOptions opt{.transpose_b = true};
  if (bias != nullptr && bias->defined()) {
    opt.epilogue = ops::GemmEpilogue::Bias;
    opt.bias = bias->value;
  }
  ops::gemm(ctx, y.view({-1, out}), x.view({-1, in}), weight.value, opt);
}

void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                     Parameter* bias) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  const Tensor dy2 = dy.view({-1, out});
  const Tensor x2 = x.view({-1, in});
  if (dx.defined()) ops::gemm(ctx, dx.view({-1, in}), dy2, weight.value, {});
  ops::gemm(ctx, weight.main_grad, dy2, x2, {.transpose_a = true, .beta = 1.0f});
  if (bias != nullptr && bias->defined()) {
    // db[o] += sum_t dy[t, o] as dy^T @ ones: one accumulate path for every dtype (sum_columns writes F32 only).
    Tensor ones = ctx.empty({dy2.dim(0), 1}, dy2.dtype());
    ops::fill(ctx, ones, 1.0);
    ops::gemm(ctx, bias->main_grad.view({out, 1}), dy2, ones, {.transpose_a = true, .beta = 1.0f});
  }
}

Linear::Linear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias,
               DType dtype) {
  weight = make_parameter(ctx, name + ".weight", {out_features, in_features}, dtype, false);
  if (bias) this->bias = make_parameter(ctx, name + ".bias", {out_features}, dtype, true);
}

void Linear::init(Context& ctx, uint64_t seed, double std) {
  init_normal(ctx, weight, seed, std);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

void Linear::forward(Context& ctx, const Tensor& y, const Tensor& x) {
  linear_forward(ctx, y, x, weight, &bias);
  saved_x_ = x;
}

void Linear::backward(Context& ctx, const Tensor& dx, const Tensor& dy) {
  MEGATRON_CHECK(saved_x_.defined(), "Linear ", weight.name, ": backward without a forward");
  linear_backward(ctx, dx, dy, saved_x_, weight, &bias);
  saved_x_ = Tensor();
}

void Linear::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
