#include "megatron/nn/moe_experts.h"

#include "megatron/ops/activation/activation.h"
#include "megatron/ops/grouped_gemm/grouped_gemm.h"

namespace megatron::nn {

GroupedExperts::GroupedExperts(Context& ctx, const std::string& name, const TransformerConfig& config,
                               const ExpertLayout& layout)
    : swiglu_(config.swiglu),
      recompute_act_(config.recompute.selective_moe_act()),
      gemm_{.algo = config.moe.per_expert_gemm ? ops::GroupedGemmAlgo::PerExpert : ops::GroupedGemmAlgo::Grouped} {
  const int E = config.moe.num_experts;
  const int64_t F = config.moe.ffn_hidden_size, h = config.hidden();
  MEGATRON_CHECK(E % layout.ep_size == 0, "experts ", name, ": ", E, " experts over EP ", layout.ep_size);
  MEGATRON_CHECK(F % layout.etp_size == 0, "experts ", name, ": --moe-ffn-hidden-size ", F,
                 " must be divisible by the expert-tensor-parallel size ", layout.etp_size);
  local_experts_ = E / layout.ep_size;
  first_expert_ = layout.ep_rank * local_experts_;
  ffn_ = F / layout.etp_size;
  const int blocks = swiglu_ ? 2 : 1;
  const TensorParallelSplit fc1_split{.dim = 1, .blocks = blocks, .rank = layout.etp_rank, .size = layout.etp_size};
  const TensorParallelSplit fc2_split{.dim = 2, .blocks = 1, .rank = layout.etp_rank, .size = layout.etp_size};
  linear_fc1 = make_parameter(ctx, name + ".linear_fc1.weight", Shape{E, F * blocks, h}, config.params_dtype, false,
                              expert_placement(fc1_split, layout.ep_rank, layout.ep_size));
  linear_fc2 = make_parameter(ctx, name + ".linear_fc2.weight", Shape{E, h, F}, config.params_dtype, false,
                              expert_placement(fc2_split, layout.ep_rank, layout.ep_size));
}

void GroupedExperts::init(Context& ctx, const TransformerConfig& config) {
  init_normal(ctx, linear_fc1, config.seed, config.init_method_std);
  init_normal(ctx, linear_fc2, config.seed, config.output_layer_init_std());
}

ExpertsSaved GroupedExperts::forward(Context& ctx, const Tensor& out, const Tensor& x,
                                     std::vector<int64_t> counts) const {
  MEGATRON_CHECK(int(counts.size()) == local_experts_, "GroupedExperts: ", counts.size(), " counts for ",
                 local_experts_, " local experts");
  const int64_t rows = x.dim(0);
  ExpertsSaved s{x, ctx.empty({rows, linear_fc1.value.dim(1)}, x.dtype()), ctx.empty({rows, ffn_}, x.dtype()),
                 std::move(counts)};
  ops::grouped_gemm(ctx, s.pre_act, x, linear_fc1.value, s.counts, gemm_);
  if (swiglu_) ops::swiglu_forward(ctx, s.act, s.pre_act);
  else ops::gelu_forward(ctx, s.act, s.pre_act);
  ops::grouped_gemm(ctx, out, s.act, linear_fc2.value, s.counts, gemm_);
  if (recompute_act_) s.act = Tensor();  // (an evaluation pass just frees it sooner)
  return s;
}

void GroupedExperts::backward(Context& ctx, ExpertsSaved&& saved, const Tensor& dx, const Tensor& dout) {
  ExpertsSaved s = std::move(saved);
  if (!s.act.defined()) {  // selective "moe_act": the activation again, by the forward's kernel (the same bits)
    s.act = ctx.empty({s.pre_act.dim(0), ffn_}, s.pre_act.dtype());
    if (swiglu_) ops::swiglu_forward(ctx, s.act, s.pre_act);
    else ops::gelu_forward(ctx, s.act, s.pre_act);
  }
  Tensor dact = ctx.empty(s.act.shape(), s.act.dtype());
  ops::grouped_gemm(ctx, dact, dout, linear_fc2.value, s.counts, {.transpose_w = false, .algo = gemm_.algo});
  ops::grouped_gemm_wgrad(ctx, linear_fc2.main_grad, dout, s.act, s.counts, /*accumulate=*/true, gemm_);
  s.act = Tensor();
  Tensor dpre = ctx.empty(s.pre_act.shape(), s.pre_act.dtype());
  if (swiglu_) ops::swiglu_backward(ctx, dpre, dact, s.pre_act);
  else ops::gelu_backward(ctx, dpre, dact, s.pre_act);
  s.pre_act = Tensor();
  ops::grouped_gemm(ctx, dx, dpre, linear_fc1.value, s.counts, {.transpose_w = false, .algo = gemm_.algo});
  ops::grouped_gemm_wgrad(ctx, linear_fc1.main_grad, dpre, s.x, s.counts, /*accumulate=*/true, gemm_);
}

void GroupedExperts::collect_parameters(ParameterList& out) {
  out.push_back(&linear_fc1);
  out.push_back(&linear_fc2);
}

}  // namespace megatron::nn
