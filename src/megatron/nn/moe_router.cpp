#include "megatron/nn/moe_router.h"

#include <algorithm>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/gemm/gemm.h"
#include "megatron/nn/moe_sinkhorn.h"
#include "megatron/ops/router/load_balancing.h"

namespace megatron::nn {
namespace {

ops::ScoreFunction score_function(RouterScore s) {
  switch (s) {
    case RouterScore::Sigmoid: return ops::ScoreFunction::Sigmoid;
    case RouterScore::SqrtSoftplus: return ops::ScoreFunction::SqrtSoftplus;
    case RouterScore::Softmax: break;
  }
  return ops::ScoreFunction::Softmax;
}

// Metric slot of each loss.
constexpr int kAuxSlot = 0, kGlobalAuxSlot = 1, kZSlot = 2, kSeqAuxSlot = 3;

// The sequences overlapping this rank's rows: (sequence, first local row, rows).
struct Segment {
  int64_t sequence, begin, rows;
};
std::vector<Segment> segments(int64_t T, const TokenRows& r) {
  const int64_t seq = r.seq > 0 ? r.seq : T;
  std::vector<Segment> out;
  for (int64_t g = r.first_row; g < r.first_row + T;) {
    const int64_t b = g / seq, end = std::min((b + 1) * seq, r.first_row + T);
    out.push_back({b, g - r.first_row, end - g});
    g = end;
  }
  return out;
}

}  // namespace

const char* router_metric_name(int i) {
  static const char* names[kRouterMetrics] = {"load_balancing_loss", "global_load_balancing_loss", "z_loss",
                                              "seq_load_balancing_loss"};
  return i >= 0 && i < kRouterMetrics ? names[i] : "?";
}

TopKRouter::TopKRouter(Context& ctx, const std::string& name, const TransformerConfig& config,
                       const parallel::TensorParallel& tp, RouterGroups groups)
    : moe_(config.moe), groups_(groups) {
  Placement placement;
  placement.grad_partial_over_tp = tp.sp() && tp.size() > 1;  // each TP rank routed its own token rows
  placement.tp = TensorParallelSplit{.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()};
  weight = make_parameter(ctx, name + ".weight", Shape{config.moe.num_experts, config.hidden()}, config.params_dtype,
                          /*no_weight_decay=*/false, placement);
  if (config.moe.expert_bias) {
    Placement replicated = placement;
    replicated.grad_partial_over_tp = false;
    expert_bias = make_parameter(ctx, name + ".expert_bias", Shape{config.moe.num_experts}, DType::F32,
                                 /*no_weight_decay=*/true, replicated);
    local_counts_ = ctx.empty({config.moe.num_experts}, DType::F32);
    ops::fill(ctx, local_counts_, 0.0);
  }
  options_ = {.score_function = score_function(moe_.score),
              .topk = moe_.topk,
              .pre_softmax = moe_.pre_softmax,
              .num_groups = moe_.num_groups,
              .group_topk = moe_.group_topk,
              .scaling_factor = moe_.topk_scaling_factor};
  if (moe_.sinkhorn)  // Megatron's _sinkhorn_activation: sigmoid for top-1, the softmax over all experts else
    options_ = {.score_function = moe_.topk == 1 ? ops::ScoreFunction::Sigmoid : ops::ScoreFunction::Softmax,
                .topk = moe_.topk,
                .pre_softmax = true};
  const std::vector<std::string> problems = ops::router_options_problems(options_, moe_.num_experts);
  MEGATRON_CHECK(problems.empty(), "router ", name, ": ", problems.empty() ? "" : problems.front());
}

void TopKRouter::init(Context& ctx, const TransformerConfig& config) {
  init_normal(ctx, weight, config.seed, config.init_method_std);
  if (expert_bias.defined()) init_constant(ctx, expert_bias, 0.0);
}

void TopKRouter::update_expert_bias(Context& ctx) {
  if (!expert_bias.defined()) return;
  if (groups_.tp_dp_cp != nullptr && groups_.tp_dp_cp->size() > 1)
    groups_.tp_dp_cp->all_reduce(local_counts_, comm::ReduceOp::Sum, ctx.stream());
  ops::router_expert_bias_update(ctx, expert_bias.value, local_counts_, moe_.bias_update_rate);
  ops::fill(ctx, local_counts_, 0.0);
}

void TopKRouter::reset_metrics(Context& ctx) {
  if (metrics_.defined()) ops::fill(ctx, metrics_, 0.0);
}

RouterSaved TopKRouter::forward(Context& ctx, const Tensor& probs, const Tensor& indices, const Tensor& x,
                                bool training, const TokenRows& rows, bool record) const {
  const int64_t T = x.dim(0), E = moe_.num_experts, k = moe_.topk;
  const DType stats = weight.main_grad.dtype();  // F32, or F64 for F64 parameters
  RouterSaved s;
  s.x = x;
  s.logits = ctx.empty({T, E}, stats);
  ops::gemm(ctx, s.logits, x, weight.value, {.transpose_b = true});
  s.scores = ctx.empty({T, E}, stats);
  s.indices = indices;
  s.rows = rows;
  ops::router_topk_forward(ctx, probs, indices, s.scores, s.logits,
                           expert_bias.defined() ? expert_bias.value : Tensor(), options_);
  if (!training) return s;
  if (moe_.sinkhorn) sinkhorn_select(ctx, indices, probs, s.logits, s.scores);
  if (expert_bias.defined() && record) ops::expert_token_counts(ctx, local_counts_, indices, /*accumulate=*/true);
  if (!metrics_.defined()) {
    metrics_ = ctx.empty({kRouterMetrics}, stats);
    ops::fill(ctx, metrics_, 0.0);
  }
  // A recomputed forward computes what its backward needs (the counts below) into a scratch metrics slot.
  const Tensor metrics = record ? metrics_ : ctx.empty({kRouterMetrics}, stats);
  if (moe_.z_loss_coeff > 0) {
    Tensor z = ctx.empty({1}, stats);
    ops::router_z_loss_forward(ctx, z, s.logits);
    Tensor slot = metrics.slice(kZSlot, kZSlot + 1);
    ops::axpby(ctx, slot, z, slot, 1.0 / groups_.tp_cp_size, 1.0);
  }
  if (moe_.aux_losses.empty()) return s;
  Tensor aux = s.scores;  // softmax: the routing scores are Megatron's scores_for_aux_loss
  if (moe_.score != RouterScore::Softmax) {
    aux = ctx.empty({T, E}, stats);
    ops::router_aux_scores(ctx, aux, s.logits, options_.score_function);
  }
  Tensor aux_indices = ctx.empty({T, k}, DType::I32);
  ops::router_topk_indices(ctx, aux_indices, aux);
  // sum over tokens of A per expert, as ones[1, T] A (in the statistics dtype, F64 included).
  Tensor ones = ctx.empty({1, T}, stats), column_sums = ctx.empty({1, E}, stats);
  ops::fill(ctx, ones, 1.0);
  ops::gemm(ctx, column_sums, ones, aux);
  for (const AuxLoss& loss : moe_.aux_losses) {
    if (loss.type == AuxLossType::SeqAuxLoss) {
      s.counts.push_back(sequence_counts(ctx, aux, aux_indices, rows, metrics));
      s.token_totals.push_back(double(rows.seq > 0 ? rows.seq : T) * groups_.cp_size);
      continue;
    }
    const bool global = loss.type == AuxLossType::GlobalAuxLoss;
    comm::Communicator* group = global ? groups_.tp_dp_cp : groups_.tp_cp;
    const int group_size = global ? groups_.tp_dp_cp_size : groups_.tp_cp_size;
    Tensor counts = ctx.empty({E}, DType::F32);  // exact integers (below 2^24 per expert)
    ops::expert_token_counts(ctx, counts, aux_indices);
    if (stats != DType::F32) {
      Tensor wide = ctx.empty({E}, stats);
      ops::cast(ctx, wide, counts);
      counts = wide;
    }
    if (group != nullptr && group->size() > 1) group->all_reduce(counts, comm::ReduceOp::Sum, ctx.stream());
    const double total = double(T) * group_size;
    s.counts.push_back(counts);
    s.token_totals.push_back(total);
    // This rank's share of loss / coeff: E / (k T_tot^2) * sum_e column_sums_e * counts_e.
    Tensor slot = metrics.slice(global ? kGlobalAuxSlot : kAuxSlot, (global ? kGlobalAuxSlot : kAuxSlot) + 1);
    Tensor dot = ctx.empty({1, 1}, stats);
    ops::gemm(ctx, dot, column_sums, counts.view({E, 1}));
    ops::axpby(ctx, slot, dot.view({1}), slot, double(E) / (double(k) * total * total), 1.0);
  }
  return s;
}

Tensor TopKRouter::sequence_counts(Context& ctx, const Tensor& aux, const Tensor& aux_indices, const TokenRows& rows,
                                   const Tensor& metrics) const {
  const int64_t T = aux.dim(0), E = moe_.num_experts, k = moe_.topk, seq = rows.seq > 0 ? rows.seq : T;
  const int64_t B = std::max<int64_t>(1, (rows.total_rows > 0 ? rows.total_rows : T) / seq);
  const DType stats = aux.dtype();
  Tensor counts = ctx.empty({B, E}, stats), one = ctx.empty({E}, DType::F32);
  ops::fill(ctx, counts, 0.0);
  const std::vector<Segment> segs = segments(T, rows);
  for (const Segment& g : segs) {
    ops::expert_token_counts(ctx, one, aux_indices.slice(g.begin, g.begin + g.rows));
    ops::cast(ctx, counts.slice(g.sequence, g.sequence + 1).view({E}), one);
  }
  if (groups_.tp_cp != nullptr && groups_.tp_cp->size() > 1) groups_.tp_cp->all_reduce(counts, comm::ReduceOp::Sum, ctx.stream());
  // This rank's share of loss / coeff: E / (k T_tot^2 B) sum over its segments of <column sums, counts[b]>.
  const double total = double(seq) * groups_.cp_size;
  Tensor slot = metrics.slice(kSeqAuxSlot, kSeqAuxSlot + 1);
  for (const Segment& g : segs) {
    Tensor ones = ctx.empty({1, g.rows}, stats), sums = ctx.empty({1, E}, stats), dot = ctx.empty({1, 1}, stats);
    ops::fill(ctx, ones, 1.0);
    ops::gemm(ctx, sums, ones, aux.slice(g.begin, g.begin + g.rows));
    ops::gemm(ctx, dot, sums, counts.slice(g.sequence, g.sequence + 1).view({E, 1}));
    ops::axpby(ctx, slot, dot.view({1}), slot, double(E) / (double(k) * total * total * double(B)), 1.0);
  }
  return counts;
}

void TopKRouter::add_sequence_aux_grad(Context& ctx, const Tensor& dlogits, const RouterSaved& s, const Tensor& counts,
                                       double factor) const {
  const int64_t T = s.logits.dim(0), E = moe_.num_experts;
  Tensor daux = ctx.empty({T, E}, s.logits.dtype());
  for (const Segment& g : segments(T, s.rows)) {
    Tensor ones = ctx.empty({g.rows, 1}, s.logits.dtype());
    ops::fill(ctx, ones, 1.0);
    ops::gemm(ctx, daux.slice(g.begin, g.begin + g.rows), ones, counts.slice(g.sequence, g.sequence + 1),
              {.alpha = float(factor)});
  }
  ops::router_aux_scores_backward(ctx, dlogits, daux, s.logits, options_.score_function);
}

void TopKRouter::backward(Context& ctx, RouterSaved&& saved, const Tensor& dx, const Tensor& dprobs,
                          double loss_grad_scale) {
  RouterSaved s = std::move(saved);
  const int64_t E = moe_.num_experts, k = moe_.topk;
  Tensor dlogits = ctx.empty(s.logits.shape(), s.logits.dtype());
  ops::router_topk_backward(ctx, dlogits, dprobs, s.scores, s.indices, s.logits, options_);
  for (size_t i = 0; i < s.counts.size(); ++i) {
    const AuxLoss& loss = moe_.aux_losses[i];
    const double total = s.token_totals[i];
    if (loss.type == AuxLossType::SeqAuxLoss) {
      const double B = double(s.counts[i].dim(0));
      add_sequence_aux_grad(ctx, dlogits, s, s.counts[i],
                            loss_grad_scale * double(E) * loss.coeff / (double(k) * total * total * B));
      continue;
    }
    Tensor daux = ctx.empty({E}, s.logits.dtype());
    ops::scale(ctx, daux, s.counts[i], loss_grad_scale * double(E) * loss.coeff / (double(k) * total * total));
    ops::router_aux_scores_backward(ctx, dlogits, daux, s.logits, options_.score_function);
  }
  if (moe_.z_loss_coeff > 0)
    ops::router_z_loss_backward(ctx, dlogits, s.logits, loss_grad_scale * moe_.z_loss_coeff / groups_.tp_cp_size);
  // Back to the parameter dtype for the two GEMMs (Megatron casts the router's gradient the same way).
  Tensor dlogits_p = dlogits;
  if (dlogits.dtype() != weight.value.dtype()) {
    dlogits_p = ctx.empty(dlogits.shape(), weight.value.dtype());
    ops::cast(ctx, dlogits_p, dlogits);
  }
  ops::gemm(ctx, dx, dlogits_p, weight.value, {});
  ops::gemm(ctx, weight.main_grad, dlogits_p, s.x, {.transpose_a = true, .beta = 1.0f});
}

void TopKRouter::collect_parameters(ParameterList& out) {
  out.push_back(&weight);
  if (expert_bias.defined()) out.push_back(&expert_bias);
}

}  // namespace megatron::nn
