#include "megatron/nn/fp8_linear.h"

#include "megatron/ops/activation/activation.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/fp8/fp8.h"
#include "megatron/ops/fp8_block/fp8_block.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::nn {

namespace {

comm::Communicator* nontrivial(comm::Communicator* group) {
  return group != nullptr && group->size() > 1 ? group : nullptr;
}

// Where a tensor's tensorwise amax is reduced: over TP when split there, over CP when it is an activation.
Fp8AmaxGroups amax_groups(const Fp8TensorSplit& split, bool tp_split, bool activation) {
  return {.tensor = tp_split ? nontrivial(split.group) : nullptr,
          .sequence = activation ? nontrivial(split.sequence_group) : nullptr};
}

void check_multiple_of_16(const Parameter& weight, const char* what, int64_t value) {
  MEGATRON_CHECK(value % 16 == 0, "FP8 linear ", weight.name, ": ", what, " = ", value,
                 " must be a multiple of 16 (cuBLASLt's FP8 GEMMs); run this layer in bf16 "
                 "(--first-last-layers-bf16) or change the shapes");
}

// This iteration's FP8 copies of the weight (cast on first use).
const Fp8CastWeight& cast_weight(Context& ctx, const Parameter& weight, const Fp8Site& site,
                                 const Fp8TensorSplit& split) {
  Fp8ScalingState& state = *site.state;
  if (const Fp8CastWeight* cached = state.cast_weight(site.index)) return *cached;
  if (weight.stored_in_fp8()) {  // --fp8-param-gather: the weight is FP8 already; only its transpose is made
    Tensor w_t = ctx.empty({weight.value.dim(1), weight.value.dim(0)}, weight.value.dtype());
    ops::transpose(ctx, w_t, weight.value);
    state.set_cast_weight(site.index, {.w = weight.value,
                                       .w_t = w_t,
                                       .scale_inv = weight.fp8_scale_inv,
                                       .scale_inv_t = weight.fp8_scale_inv});
    return *state.cast_weight(site.index);
  }
  const DType dt = state.recipe().forward_dtype();
  Fp8Operand w = fp8_quantize(ctx, weight.value, dt, state, state.weight(site.index), true, true,
                              amax_groups(split, split.weight, false), /*weight=*/true);
  state.set_cast_weight(
      site.index, {.w = w.q, .w_t = w.q_t, .scale_inv = w.scale_inv, .scale_inv_t = w.scale_inv_t, .layout = w.layout});
  return *state.cast_weight(site.index);
}

}  // namespace

namespace {

// The delayed cast of `in` with `scale`: the plain cast of a stored operand, the fused one of a produced one.
void delayed_cast(Context& ctx, const Fp8Operand& out, const Tensor& amax, const LinearOperand& in,
                  const Tensor& scale) {
  const int64_t rows = in.rows();
  switch (in.op()) {
    case LinearOperand::Op::Stored:
      ops::fp8_cast_transpose(ctx, out.q, out.q_t, amax, in.tensor().view({rows, in.cols()}), scale);
      return;
    case LinearOperand::Op::Swiglu:
      ops::fp8_swiglu_cast_transpose(ctx, out.q, out.q_t, amax, in.x().view({rows, 2 * in.cols()}), scale);
      return;
    case LinearOperand::Op::SwigluGrad:
      ops::fp8_swiglu_grad_cast_transpose(ctx, out.q, out.q_t, amax, in.dy().view({rows, in.cols() / 2}),
                                          in.x().view({rows, in.cols()}), scale);
      return;
  }
}

}  // namespace

Fp8Operand fp8_quantize(Context& ctx, const LinearOperand& operand, DType dtype, const Fp8ScalingState& state,
                        const Fp8TensorScaling& slot, bool want_q, bool want_t, const Fp8AmaxGroups& groups,
                        bool weight) {
  const Fp8Recipe& recipe = state.recipe();
  if (!operand.stored() && recipe.scaling != Fp8Scaling::Delayed)
    return fp8_quantize(ctx, operand.materialise(ctx), dtype, state, slot, want_q, want_t, groups, weight);
  const int64_t rows = operand.rows(), cols = operand.cols();
  Fp8Operand out;
  if (want_q) out.q = ctx.empty({rows, cols}, dtype);
  if (want_t) out.q_t = ctx.empty({cols, rows}, dtype);
  if (recipe.scaling == Fp8Scaling::Delayed) {
    // cuBLASLt refuses scale pointers inside the state's vectors (it wants them aligned beyond 4 bytes): the
    // GEMMs read a copy in an allocation of its own.
    out.scale_inv = ctx.empty({1}, DType::F32);
    out.scale_inv_t = out.scale_inv;
    ops::copy(ctx, out.scale_inv, slot.scale_inv);
    delayed_cast(ctx, out, state.recording() ? slot.amax : Tensor(), operand, slot.scale);
    return out;
  }
  const Tensor in2 = operand.tensor().view({rows, cols});
  if (recipe.scaling == Fp8Scaling::Blockwise) {
    out.layout = weight ? ops::Fp8ScaleLayout::Blocks128x128 : ops::Fp8ScaleLayout::Rows1x128;
    if (want_q) out.scale_inv = ctx.empty(ops::fp8_scale_shape(out.layout, rows, cols), DType::F32);
    if (want_t) out.scale_inv_t = ctx.empty(ops::fp8_scale_shape(out.layout, cols, rows), DType::F32);
    ops::fp8_block_quantize(ctx, out.q, out.scale_inv, out.q_t, out.scale_inv_t, in2, out.layout);
    return out;
  }
  // Current scaling: this tensor's own amax (of the whole tensor when it is split over TP), then the scale.
  Tensor amax = ctx.empty({1}, DType::F32);
  ops::amax(ctx, amax, in2);
  for (comm::Communicator* group : {groups.tensor, groups.sequence})
    if (group != nullptr) group->all_reduce(amax, comm::ReduceOp::Max, ctx.stream());
  Tensor scale = ctx.empty({1}, DType::F32);
  out.scale_inv = ctx.empty({1}, DType::F32);
  ops::fp8_scale_from_amax(ctx, scale, out.scale_inv, amax, fp8_max(dtype), recipe.margin,
                           /*keep_on_invalid=*/false);
  out.scale_inv_t = out.scale_inv;
  ops::fp8_cast_transpose(ctx, out.q, out.q_t, Tensor(), in2, scale);
  return out;
}

LinearSaved fp8_linear_forward(Context& ctx, const Tensor& y, const LinearOperand& x, const Parameter& weight,
                               const Parameter* bias, const Fp8Site& site, const Fp8TensorSplit& split,
                               const Tensor& gelu_input_out) {
  const int64_t in = weight.value.dim(1), out = weight.value.dim(0);
  MEGATRON_CHECK(x.cols() == in, "FP8 linear ", weight.name, ": the input has ", x.cols(), " columns, the weight ",
                 weight.value.describe(), " takes ", in);
  check_multiple_of_16(weight, "the input features", in);
  check_multiple_of_16(weight, "the output features", out);
  check_multiple_of_16(weight, "the token rows", x.rows());
  const Fp8ScalingState& state = *site.state;
  const Fp8CastWeight& w = cast_weight(ctx, weight, site, split);
  Fp8Operand xq = fp8_quantize(ctx, x, state.recipe().forward_dtype(), state, state.input(site.index), true, true,
                               amax_groups(split, split.input, true));
  ops::GemmOptions opt{.transpose_b = true,
                       .a_scale = xq.scale_inv,
                       .b_scale = w.scale_inv,
                       .a_scale_layout = xq.layout,
                       .b_scale_layout = w.layout};
  if (bias != nullptr && bias->defined()) {
    opt.epilogue = ops::GemmEpilogue::Bias;
    opt.bias = bias->value;
    if (bias->value.dtype() != DType::BF16 && bias->value.dtype() != DType::F16) {
      // cuBLASLt's FP8 GEMMs take a bf16 bias (fp16 for an fp16 output): an F32 model's bias enters in bf16.
      opt.bias = ctx.empty(bias->value.shape(), DType::BF16);
      ops::cast(ctx, opt.bias, bias->value);
    }
  }
  if (!gelu_input_out.defined()) {
    ops::gemm(ctx, y.view({-1, out}), xq.q, w.w, opt);
  } else {  // the pre-activation from the GEMM, then the GELU as its own pass
    ops::gemm(ctx, gelu_input_out.view({-1, out}), xq.q, w.w, opt);
    ops::gelu_forward(ctx, y.view({-1, out}), gelu_input_out.view({-1, out}));
  }
  return LinearSaved{.x_fp8_t = xq.q_t, .x_scale_inv = xq.scale_inv_t, .x_scale_layout = xq.layout};
}

Fp8Grad fp8_linear_grad(Context& ctx, const LinearOperand& dy, const Fp8Site& site, const Fp8TensorSplit& split,
                        bool bias_gradient) {
  const Fp8ScalingState& state = *site.state;
  Fp8Grad g{.rows = dy.rows()};
  LinearOperand source = dy;
  if (bias_gradient) {  // the column sums need the stored gradient
    g.dy = dy.materialise(ctx).view({dy.rows(), dy.cols()});
    source = g.dy;
  }
  g.q = fp8_quantize(ctx, source, state.recipe().grad_dtype(), state, state.grad(site.index), true, true,
                     amax_groups(split, split.grad, true));
  return g;
}

void fp8_linear_backward_input(Context& ctx, const Tensor& dx, const Fp8Grad& g, const Parameter& weight,
                               const Fp8Site& site, const Fp8TensorSplit& split, const Tensor& dx_gelu_input) {
  const int64_t in = weight.value.dim(1);
  const Fp8CastWeight& w = cast_weight(ctx, weight, site, split);
  const ops::GemmOptions opt{.transpose_b = true,
                             .a_scale = g.q.scale_inv,
                             .b_scale = w.scale_inv_t,
                             .a_scale_layout = g.q.layout,
                             .b_scale_layout = w.layout};
  if (!dx_gelu_input.defined()) {
    ops::gemm(ctx, dx.view({-1, in}), g.q.q, w.w_t, opt);
    return;
  }
  Tensor dact = ctx.empty({g.rows, in}, dx.dtype());
  ops::gemm(ctx, dact, g.q.q, w.w_t, opt);
  ops::gelu_backward(ctx, dx.view({-1, in}), dact, dx_gelu_input.view({-1, in}));
}

void fp8_linear_backward_weight(Context& ctx, const Fp8Grad& g, const LinearSaved& saved, Parameter& weight,
                                Parameter* bias) {
  MEGATRON_CHECK(saved.x_fp8_t.defined(), "FP8 linear ", weight.name, ": backward without its forward's FP8 input");
  ops::gemm(ctx, weight.main_grad, g.q.q_t, saved.x_fp8_t,
            {.transpose_b = true,
             .beta = 1.0f,
             .a_scale = g.q.scale_inv_t,
             .b_scale = saved.x_scale_inv,
             .a_scale_layout = g.q.layout,
             .b_scale_layout = saved.x_scale_layout});
  if (bias == nullptr || !bias->defined()) return;
  MEGATRON_CHECK(g.dy.defined(), "FP8 linear ", weight.name, ": the bias gradient needs the output gradient, ",
                 "which fp8_linear_grad keeps only when asked for it (bias_gradient)");
  Tensor db = ctx.empty({g.dy.dim(1)}, DType::F32);  // the column sums come in f32
  ops::sum_columns(ctx, db, g.dy);
  if (bias->main_grad.dtype() != DType::F32) {  // F64 parameters (the CPU's double-precision emulation)
    Tensor wide = ctx.empty(db.shape(), bias->main_grad.dtype());
    ops::cast(ctx, wide, db);
    db = wide;
  }
  ops::add(ctx, bias->main_grad, bias->main_grad, db);
}

}  // namespace megatron::nn
