#include "megatron/nn/row_parallel_linear.h"

#include "megatron/parallel/mappings.h"

namespace megatron::nn {

RowParallelLinear::RowParallelLinear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features,
                                     bool bias, DType dtype, const parallel::TensorParallel& tp,
                                     RowParallelOptions options)
    : tp_(tp), options_(options) {
  weight = make_parameter(ctx, name + ".weight", {out_features, in_features}, dtype, false,
                          {.tp = {.dim = 1, .blocks = 1, .rank = tp.rank(), .size = tp.size()}});
  if (bias)
    this->bias = make_parameter(ctx, name + ".bias", {out_features}, dtype, true,
                                {.tp = {.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()}});
}

void RowParallelLinear::init(Context& ctx, uint64_t seed, double std) {
  init_normal(ctx, weight, seed, std);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

LinearSaved RowParallelLinear::local_forward(Context& ctx, const Tensor& y, const LinearOperand& x,
                                            const Parameter* bias) const {
  if (fp8_.enabled()) return fp8_linear_forward(ctx, y, x, weight, bias, fp8_, fp8_split());
  linear_forward(ctx, y, x.tensor(), weight, bias);
  return LinearSaved{x.tensor()};
}

void RowParallelLinear::local_backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, const Tensor& dy,
                                       const Tensor& dx_gelu_input) {
  const LinearSaved s = std::move(saved);
  MEGATRON_CHECK(s.defined(), "RowParallelLinear ", weight.name, ": backward without a forward's saved input");
  if (!fp8_.enabled()) {
    if (dx.defined()) linear_backward_input(ctx, dx, dy, weight, dx_gelu_input);
    linear_backward_weight(ctx, dy, s.x, weight, &bias);
    return;
  }
  const Fp8Grad g = fp8_linear_grad(ctx, dy, fp8_, fp8_split(), bias.defined());
  if (dx.defined()) fp8_linear_backward_input(ctx, dx, g, weight, fp8_, fp8_split(), dx_gelu_input);
  fp8_linear_backward_weight(ctx, g, s, weight, &bias);
}

LinearSaved RowParallelLinear::forward(Context& ctx, const Tensor& y, const LinearOperand& x) const {
  // A produced input reaches the FP8 cast as it is only when this rank's slice goes straight into the GEMM.
  if (!x.stored() && !(fp8_.enabled() && options_.input_is_parallel)) return forward(ctx, y, x.materialise(ctx));
  if (!tp_.enabled()) return local_forward(ctx, y, x, &bias);
  const int64_t rows = x.rows(), in = in_features(), out = out_features();
  LinearOperand part = x;
  if (!options_.input_is_parallel) {
    Tensor slice = ctx.empty({rows, in}, x.dtype());
    parallel::scatter_to_tp_forward(ctx, tp_, slice, x.tensor().view({rows, x.cols()}));
    part = slice;
  }
  const Parameter* once = tp_.rank() == 0 ? &bias : nullptr;  // the replicated bias, added by one rank
  if (!tp_.sp()) {
    LinearSaved saved = local_forward(ctx, y, part, once);
    parallel::reduce_from_tp_forward(ctx, tp_, y);
    return saved;
  }
  if (tp_.pipelined_rs() && !fp8_.enabled()) {  // each chunk's partial product sent on while the next computes
    const int64_t r = rows / tp_.size();
    const Tensor& whole = part.tensor();
    parallel::ring_reduce_scatter(ctx, tp_, y.view({-1, out}), [&](int c, const Tensor& partial) {
      linear_forward(ctx, partial, parallel::row_block(whole, in, c * r, r), weight, once);
    });
    return LinearSaved{whole};
  }
  Tensor partial = ctx.empty({rows, out}, x.dtype());
  LinearSaved saved = local_forward(ctx, partial, part, once);
  parallel::reduce_scatter_to_sp_forward(ctx, tp_, y.view({-1, out}), partial);
  return saved;
}

void RowParallelLinear::backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, const Tensor& dy,
                                 const Tensor& dx_gelu_input) {
  if (!tp_.enabled()) {
    local_backward(ctx, std::move(saved), dx, dy, dx_gelu_input);
    return;
  }
  const int64_t rows = dy.shape().rows() * (tp_.sp() ? tp_.size() : 1), out = out_features();
  if (tp_.pipelined_ag() && !fp8_.enabled() && (!dx.defined() || options_.input_is_parallel)) {
    // dy's all-gather pipelined with the input-gradient GEMM; the weight gradient then reads the gathered dy.
    const LinearSaved s = std::move(saved);
    MEGATRON_CHECK(s.defined(), "RowParallelLinear ", weight.name, ": backward without a forward's saved input");
    const int64_t r = dy.shape().rows(), in = in_features();
    Tensor dwhole = ctx.empty({rows, out}, dy.dtype());
    parallel::ring_all_gather(ctx, tp_, dy.view({-1, out}), dwhole, [&](int c, const Tensor& rows_dy) {
      if (dx.defined())
        linear_backward_input(ctx, parallel::row_block(dx, in, c * r, r), rows_dy, weight,
                              dx_gelu_input.defined() ? parallel::row_block(dx_gelu_input, in, c * r, r) : Tensor());
    });
    linear_backward_weight(ctx, dwhole, s.x, weight, &bias);
    return;
  }
  Tensor dwhole = dy;
  if (tp_.sp()) {
    dwhole = ctx.empty({rows, out}, dy.dtype());
    parallel::reduce_scatter_to_sp_backward(ctx, tp_, dwhole, dy.view({-1, out}));
  }
  if (!dx.defined() || options_.input_is_parallel) {
    local_backward(ctx, std::move(saved), dx, dwhole, dx_gelu_input);
    return;
  }
  MEGATRON_CHECK(!dx_gelu_input.defined(), "RowParallelLinear ", weight.name,
                 ": the DGELU epilogue needs a parallel input");
  Tensor dpart = ctx.empty({rows, in_features()}, dy.dtype());
  local_backward(ctx, std::move(saved), dpart, dwhole, Tensor());
  parallel::scatter_to_tp_backward(ctx, tp_, dx.view({rows, dx.shape().cols()}), dpart);
}

void RowParallelLinear::enable_fp8(const std::shared_ptr<Fp8ScalingState>& state,
                                      comm::Communicator* sequence_group) {
  sequence_group_ = sequence_group;
  fp8_ = register_fp8_linear(state, weight.name);
}

void RowParallelLinear::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
