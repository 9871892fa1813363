#include "megatron/nn/column_parallel_linear.h"

#include "megatron/parallel/mappings.h"
#include "megatron/runtime/timeline.h"

namespace megatron::nn {

void column_parallel_linear_forward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& y, const Tensor& x,
                                    const Parameter& weight, const Parameter* bias, const Tensor& gelu_input_out) {
  if (!tp.sp()) {  // copy_to_tp: the whole input is already on every rank
    linear_forward(ctx, y, x, weight, bias, gelu_input_out);
    return;
  }
  const int64_t in = weight.value.dim(1);
  const Tensor shard = x.view({-1, in});
  if (tp.pipelined_ag()) {  // each rank's rows multiplied as they arrive around the ring
    const int64_t r = shard.dim(0), out = y.shape().cols();
    parallel::ring_all_gather(ctx, tp, shard, Tensor(), [&](int c, const Tensor& rows) {
      linear_forward(ctx, parallel::row_block(y, out, c * r, r), rows, weight, bias,
                     gelu_input_out.defined() ? parallel::row_block(gelu_input_out, out, c * r, r) : Tensor());
    });
    return;
  }
  Tensor whole = ctx.empty({shard.dim(0) * tp.size(), in}, x.dtype());
  parallel::gather_from_sp_forward(ctx, tp, whole, shard);
  linear_forward(ctx, y, whole, weight, bias, gelu_input_out);
}

void column_parallel_linear_backward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& dx,
                                     const Tensor& dy, const Tensor& x, Parameter& weight, Parameter* bias) {
  if (!tp.enabled()) {
    linear_backward(ctx, dx, dy, x, weight, bias);
    return;
  }
  if (!tp.sp()) {
    // dx's all-reduce runs while the weight-gradient GEMM computes.
    parallel::PendingCollective reduce;
    if (dx.defined()) {
      linear_backward_input(ctx, dx, dy, weight);
      reduce = parallel::copy_to_tp_backward(ctx, tp, dx, /*async=*/true);
    }
    linear_backward_weight(ctx, dy, x, weight, bias);
    reduce.wait(ctx);
    return;
  }
  // Sequence parallel: re-gather the input shard while dx's GEMM computes (bulk_dgrad), then reduce-scatter dx
  // while the weight-gradient GEMM computes (bulk_wgrad) -- or, with rs_dgrad, dx's reduce-scatter pipelined
  // with its own GEMM, chunk by chunk, before the weight gradient.
  const int64_t in = weight.value.dim(1), rows = dy.shape().rows();
  const parallel::TpCommOverlap& overlap = tp.comm_overlap;
  const Tensor shard = x.view({-1, in});
  Tensor whole = ctx.empty({rows, in}, x.dtype());
  parallel::PendingCollective gather = parallel::gather_from_sp_forward(ctx, tp, whole, shard, overlap.bulk_dgrad);
  parallel::PendingCollective scatter;
  if (dx.defined() && overlap.rs_dgrad) {
    const int64_t r = rows / tp.size(), out = dy.shape().cols();
    parallel::ring_reduce_scatter(ctx, tp, dx.view({-1, in}), [&](int c, const Tensor& partial) {
      linear_backward_input(ctx, partial, parallel::row_block(dy, out, c * r, r), weight);
    });
  } else if (dx.defined()) {
    Tensor dwhole = ctx.empty({rows, in}, dy.dtype());
    {
      TimelineScope span(ctx.timeline(), "dgrad GEMM (bulk all-gather beside)", "tp-gemm");
      linear_backward_input(ctx, dwhole, dy, weight);
    }
    gather.wait(ctx);
    scatter = parallel::gather_from_sp_backward(ctx, tp, dx.view({-1, in}), dwhole, overlap.bulk_wgrad);
  }
  gather.wait(ctx);
  {
    TimelineScope span(ctx.timeline(), "wgrad GEMM (bulk reduce-scatter beside)", "tp-gemm");
    linear_backward_weight(ctx, dy, whole, weight, bias);
  }
  scatter.wait(ctx);
}

ColumnParallelLinear::ColumnParallelLinear(Context& ctx, const std::string& name, int64_t in_features,
                                           int64_t out_features, bool bias, DType dtype,
                                           const parallel::TensorParallel& tp, ColumnParallelOptions options)
    : tp_(tp), options_(options) {
  const Placement split{.tp = {.dim = 0, .blocks = options.blocks, .rank = tp.rank(), .size = tp.size()}};
  weight = make_parameter(ctx, name + ".weight", {out_features, in_features}, dtype, false, split);
  if (bias) this->bias = make_parameter(ctx, name + ".bias", {out_features}, dtype, true, split);
}

void ColumnParallelLinear::init(Context& ctx, uint64_t seed, double std) {
  init_normal(ctx, weight, seed, std);
  if (bias.defined()) init_constant(ctx, bias, 0.0);
}

LinearSaved ColumnParallelLinear::forward(Context& ctx, const Tensor& y, const Tensor& x,
                                          const Tensor& gelu_input_out) const {
  if (fp8_.enabled()) return fp8_forward(ctx, y, x, gelu_input_out);
  if (!options_.gather_output || !tp_.enabled()) {
    column_parallel_linear_forward(ctx, tp_, y, x, weight, &bias, gelu_input_out);
    return LinearSaved{x};
  }
  MEGATRON_CHECK(!gelu_input_out.defined(), "ColumnParallelLinear ", weight.name,
                 ": the GELU epilogue needs the unsplit output; not available with gather_output");
  Tensor part = ctx.empty({y.shape().rows(), out_features()}, y.dtype());
  column_parallel_linear_forward(ctx, tp_, part, x, weight, &bias);
  parallel::gather_from_tp_forward(ctx, tp_, y.view({-1, y.shape().cols()}), part);
  return LinearSaved{x};
}

void ColumnParallelLinear::backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, LinearOperand dy_in) {
  if (fp8_.enabled()) {
    fp8_backward(ctx, saved, dx, std::move(dy_in));
    saved = LinearSaved();
    return;
  }
  const Tensor dy = dy_in.materialise(ctx);
  const Tensor x = std::move(saved.x);
  MEGATRON_CHECK(x.defined(), "ColumnParallelLinear ", weight.name, ": backward without a forward's saved input");
  Tensor dpart = dy;
  if (options_.gather_output && tp_.enabled()) {
    dpart = ctx.empty({dy.shape().rows(), out_features()}, dy.dtype());
    parallel::gather_from_tp_backward(ctx, tp_, dpart, dy.view({-1, dy.shape().cols()}));
  }
  column_parallel_linear_backward(ctx, tp_, dx, dpart, x, weight, &bias);
}

void ColumnParallelLinear::enable_fp8(const std::shared_ptr<Fp8ScalingState>& state,
                                      comm::Communicator* sequence_group) {
  sequence_group_ = sequence_group;
  MEGATRON_CHECK(!options_.gather_output, "ColumnParallelLinear ", weight.name, ": FP8 needs gather_output off");
  fp8_ = register_fp8_linear(state, weight.name);
}

LinearSaved ColumnParallelLinear::fp8_forward(Context& ctx, const Tensor& y, const Tensor& x,
                                              const Tensor& gelu_input_out) const {
  Tensor whole = x;
  if (tp_.sp()) {
    const Tensor shard = x.view({-1, in_features()});
    whole = ctx.empty({shard.dim(0) * tp_.size(), in_features()}, x.dtype());
    parallel::gather_from_sp_forward(ctx, tp_, whole, shard);
  }
  return fp8_linear_forward(ctx, y, whole, weight, &bias, fp8_, fp8_split(), gelu_input_out);
}

void ColumnParallelLinear::fp8_backward(Context& ctx, const LinearSaved& saved, const Tensor& dx,
                                        LinearOperand&& dy) {
  const Fp8TensorSplit split = fp8_split();
  const Fp8Grad g = fp8_linear_grad(ctx, dy, fp8_, split, bias.defined());
  const DType dtype = dy.dtype();
  dy = LinearOperand(Tensor());  // the cast has read it (a produced operand's inputs are freed here)
  parallel::PendingCollective reduce;
  if (dx.defined()) {
    // dx's all-reduce (or reduce-scatter under SP) runs while the weight-gradient GEMM computes.
    const int64_t in = in_features(), rows = g.rows;
    Tensor dwhole = tp_.sp() ? ctx.empty({rows, in}, dtype) : dx;
    fp8_linear_backward_input(ctx, dwhole, g, weight, fp8_, split);
    if (tp_.sp()) reduce = parallel::gather_from_sp_backward(ctx, tp_, dx.view({-1, in}), dwhole, /*async=*/true);
    else if (tp_.enabled()) reduce = parallel::copy_to_tp_backward(ctx, tp_, dx, /*async=*/true);
  }
  fp8_linear_backward_weight(ctx, g, saved, weight, &bias);
  reduce.wait(ctx);
}

void ColumnParallelLinear::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (bias.defined()) out.push_back(&bias);
}

}  // namespace megatron::nn
