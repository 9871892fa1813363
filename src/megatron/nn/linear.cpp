#include "megatron/nn/linear.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::nn {

void linear_forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight, const Parameter* bias,
                    const Tensor& gelu_input_out) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  const bool has_bias = bias != nullptr && bias->defined();
  const bool gelu = gelu_input_out.defined();
  ops::GemmOptions opt{.transpose_b = true};
  if (has_bias) opt.bias = bias->value;
  if (gelu) {
    opt.epilogue = has_bias ? ops::GemmEpilogue::BiasGelu : ops::GemmEpilogue::Gelu;
    opt.gelu_input_out = gelu_input_out.view({-1, out});
  } else if (has_bias) {
    opt.epilogue = ops::GemmEpilogue::Bias;
  }
  ops::gemm(ctx, y.view({-1, out}), x.view({-1, in}), weight.value, opt);
}

void linear_backward_input(Context& ctx, const Tensor& dx, const Tensor& dy, const Parameter& weight,
                           const Tensor& dx_gelu_input) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  ops::GemmOptions opt{};
  if (dx_gelu_input.defined()) {
    opt.epilogue = ops::GemmEpilogue::DGelu;
    opt.gelu_input = dx_gelu_input.view({-1, in});
  }
  ops::gemm(ctx, dx.view({-1, in}), dy.view({-1, out}), weight.value, opt);
}

void linear_backward_weight(Context& ctx, const Tensor& dy, const Tensor& x, Parameter& weight, Parameter* bias) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  const Tensor dy2 = dy.view({-1, out});
  const Tensor x2 = x.view({-1, in});
  if (bias == nullptr || !bias->defined()) {
    ops::gemm(ctx, weight.main_grad, dy2, x2, {.transpose_a = true, .beta = 1.0f});
    return;
  }
  // The bias gradient sum_t dy[t, :] comes out of the weight-gradient gemm's epilogue (assigned, so into a
  // scratch) and is then accumulated into the main grad.
  Tensor db = ctx.empty({out}, bias->main_grad.dtype());
  ops::gemm(ctx, weight.main_grad, dy2, x2, {.transpose_a = true, .beta = 1.0f, .bias_grad_out = db});
  ops::add(ctx, bias->main_grad, bias->main_grad, db);
}

void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                     Parameter* bias, const Tensor& dx_gelu_input) {
  if (dx.defined()) linear_backward_input(ctx, dx, dy, weight, dx_gelu_input);
  linear_backward_weight(ctx, dy, x, weight, bias);
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

void Linear::forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& gelu_input_out) {
  linear_forward(ctx, y, x, weight, &bias, gelu_input_out);
  saved_x_ = x;
}

void Linear::backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& dx_gelu_input) {
  MEGATRON_CHECK(saved_x_.defined(), "Linear ", weight.name, ": backward without a forward");
  linear_backward(ctx, dx, dy, saved_x_, weight, &bias, dx_gelu_input);
  saved_x_ = Tensor();
}

void Linear::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
