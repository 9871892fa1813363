#include "megatron/nn/moe_layer.h"

#include <numeric>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/nn/moe_capacity.h"
#include "megatron/ops/moe_permute/moe_permute.h"
#include "megatron/ops/router/router.h"

namespace megatron::nn {
namespace {

// x's rows gathered over `group` in rank order (x itself without a group).
Tensor gather_rows(Context& ctx, comm::Communicator* group, const Tensor& x) {
  if (group == nullptr || group->size() == 1) return x;
  std::vector<int64_t> dims = x.shape().dims();
  dims[0] *= group->size();
  Tensor out = ctx.empty(Shape(dims), x.dtype());
  group->all_gather(out, x, ctx.stream());
  return out;
}

// The sum over `group` of x's rows, each rank keeping its own block of them (x itself without a group).
void reduce_scatter_rows(Context& ctx, comm::Communicator* group, const Tensor& out, const Tensor& x) {
  if (group == nullptr || group->size() == 1) {
    ops::copy(ctx, out, x);
    return;
  }
  group->reduce_scatter(out, x, comm::ReduceOp::Sum, ctx.stream());
}

TransformerConfig shared_expert_config(const TransformerConfig& config) {
  TransformerConfig c = config;
  c.ffn_hidden_size = config.moe.shared_expert_ffn;
  return c;
}

}  // namespace

MoELayer::MoELayer(Context& ctx, const std::string& prefix, const TransformerConfig& config,
                   const parallel::TensorParallel& tp, const MoeParallel& parallel)
    : router(ctx, prefix + ".router", config, tp, parallel.router),
      experts(ctx, prefix + ".experts", config, parallel.experts),
      parallel_(parallel),
      moe_(config.moe),
      recompute_shared_(config.recompute.selective_shared_experts()) {
  if (moe_.shared_expert_ffn > 0)
    shared_experts = std::make_unique<MLP>(ctx, prefix + ".shared_experts", shared_expert_config(config), tp);
  if (shared_experts && moe_.shared_expert_gate) {
    Placement replicated;
    replicated.grad_partial_over_tp = tp.sp() && tp.size() > 1;  // each TP rank gated its own token rows
    replicated.tp = TensorParallelSplit{.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()};
    shared_gate = make_parameter(ctx, prefix + ".shared_experts.gate_weight", Shape{1, config.hidden()},
                                 config.params_dtype, /*no_weight_decay=*/false, replicated);
  }
}

void MoELayer::init(Context& ctx, const TransformerConfig& config) {
  router.init(ctx, config);
  experts.init(ctx, config);
  if (shared_experts) shared_experts->init(ctx, shared_expert_config(config));
  if (shared_gate.defined()) init_normal(ctx, shared_gate, config.seed, config.init_method_std);
}

namespace {
// The gate's sigmoid: the router's top-1 of one "expert" under sigmoid scoring, whose probability is the plain
// sigmoid of the logit and whose backward is its derivative (ops/router/router.h).
const ops::RouterOptions kSigmoidGate{.score_function = ops::ScoreFunction::Sigmoid, .topk = 1};
}  // namespace

void MoELayer::shared_forward(Context& ctx, MoESaved& s, const Tensor& out, const Tensor& x, bool training) const {
  const int64_t T = x.dim(0), h = x.dim(1);
  const bool drop = recompute_shared_ && training;  // the backward runs them again from their input
  if (!shared_gate.defined()) {
    s.shared = shared_experts->forward(ctx, out, x);
    if (drop) s.shared = MLPSaved(), s.shared_dropped = true;
    return;
  }
  Tensor pre = ctx.empty({T, h}, x.dtype());
  s.shared = shared_experts->forward(ctx, pre, x);
  s.gate_x = x;
  s.gate_logits = ctx.empty({T, 1}, x.dtype());
  linear_forward(ctx, s.gate_logits, x, shared_gate, nullptr);
  const DType f32 = x.dtype() == DType::F64 ? DType::F64 : DType::F32;  // the router's probabilities' dtype
  Tensor gate = ctx.empty({T, 1}, f32);
  s.gate_index = ctx.empty({T, 1}, DType::I32);
  s.gate_scores = ctx.empty({T, 1}, f32);
  ops::router_topk_forward(ctx, gate, s.gate_index, s.gate_scores, s.gate_logits, Tensor(), kSigmoidGate);
  ops::scale_rows(ctx, out, pre, gate.view({T}));
  if (drop) s.shared = MLPSaved(), s.shared_dropped = true;
  else s.shared_out = pre;
}

void MoELayer::shared_backward(Context& ctx, MoESaved& s, const Tensor& dx, const Tensor& dout) {
  const int64_t T = dout.dim(0), h = dout.dim(1);
  Tensor dshared = dout;
  if (shared_gate.defined()) {
    // out = pre * g(z), z = x . w: d pre = dout * g, dg = sum over the row of dout * pre, dz = g'(z) dg.
    Tensor gate = s.gate_scores.view({T});  // the sigmoid scores are the gate (top-1 of one, unscaled)
    dshared = ctx.empty({T, h}, dout.dtype());
    ops::scale_rows(ctx, dshared, dout, gate);
    Tensor prod = ctx.empty({T, h}, dout.dtype()), sums = ctx.empty({T}, DType::F32);
    ops::mul(ctx, prod, dout, s.shared_out);
    ops::sum_rows(ctx, sums, prod);
    Tensor dgate = sums.view({T, 1});
    if (s.gate_scores.dtype() != DType::F32) {  // F64 models (the CPU's finite differences)
      dgate = ctx.empty({T, 1}, s.gate_scores.dtype());
      ops::cast(ctx, dgate, sums.view({T, 1}));
    }
    Tensor dlogits = ctx.empty({T, 1}, dout.dtype());
    ops::router_topk_backward(ctx, dlogits, dgate, s.gate_scores, s.gate_index, s.gate_logits, kSigmoidGate);
    Tensor dx_gate = ctx.empty({T, h}, dout.dtype());
    linear_backward(ctx, dx_gate, dlogits, s.gate_x, shared_gate, nullptr);
    ops::add(ctx, dx, dx, dx_gate);
    s.gate_x = s.gate_logits = s.gate_scores = s.gate_index = s.shared_out = Tensor();
  }
  Tensor dx_shared = ctx.empty({T, h}, dout.dtype());
  shared_experts->backward(ctx, std::move(s.shared), dx_shared, dshared);
  ops::add(ctx, dx, dx, dx_shared);
}

bool MoELayer::all_to_all() const {
  return moe_.dispatcher == TokenDispatcher::AllToAll && parallel_.ep != nullptr && parallel_.ep->size() > 1;
}

MoESaved MoELayer::forward(Context& ctx, const Tensor& out, const Tensor& x_in, bool training,
                           const TokenRows& rows, Timers* timers, bool recomputing) const {
  const int64_t h = x_in.shape()[x_in.shape().rank() - 1], T = x_in.numel() / h, k = moe_.topk;
  const Tensor x = x_in.view({T, h}), y = out.view({T, h});
  MoESaved s;
  s.tokens = T;
  Tensor probs = ctx.empty({T, k}, router.weight.main_grad.dtype()), indices = ctx.empty({T, k}, DType::I32);
  s.router = router.forward(ctx, probs, indices, x, training, rows, /*record=*/!recomputing);
  if (moe_.capacity_factor > 0) {  // the router's backward keeps the full selection; dropped slots get d prob 0
    Tensor kept_probs = ctx.empty(probs.shape(), probs.dtype()), kept = ctx.empty(indices.shape(), DType::I32);
    drop_over_capacity(ctx, kept_probs, kept, probs, indices, moe_);
    probs = kept_probs;
    indices = kept;
  }

  // allgather: every rank of the dispatch group permutes all of the group's tokens; alltoall: its own.
  comm::Communicator* group = all_to_all() ? nullptr : parallel_.dispatch;
  const Tensor xg = gather_rows(ctx, group, x), ig = gather_rows(ctx, group, indices);
  s.probs = gather_rows(ctx, group, probs);
  const int64_t TG = xg.dim(0), R = TG * k;
  Tensor permuted = ctx.empty({R, h}, x.dtype()), counts = ctx.empty({moe_.num_experts}, DType::I32);
  s.row_map = ctx.empty({TG, k}, DType::I32);
  ops::moe_permute(ctx, permuted, s.row_map, counts, xg, ig);
  std::vector<int32_t> host(size_t(moe_.num_experts));
  copy_tensor(ctx, Tensor::from_blob(host.data(), {moe_.num_experts}, DType::I32, Device::cpu()), counts);
  if (all_to_all()) experts_all_to_all(ctx, s, permuted, host, timers);
  else experts_all_gather(ctx, s, permuted, host);

  Tensor yg = group != nullptr && group->size() > 1 ? ctx.empty({TG, h}, x.dtype()) : y;
  ops::moe_unpermute(ctx, yg, s.expert_out, s.row_map, s.probs);
  if (yg.data_ptr() != y.data_ptr()) reduce_scatter_rows(ctx, group, y, yg);
  if (shared_experts) {
    Tensor shared = ctx.empty({T, h}, x.dtype());
    shared_forward(ctx, s, shared, x, training);
    ops::add(ctx, y, y, shared);
  }
  return s;
}

void MoELayer::experts_all_gather(Context& ctx, MoESaved& s, const Tensor& permuted,
                                  const std::vector<int32_t>& counts) const {
  const int64_t R = permuted.dim(0);
  const int first = experts.first_expert(), n = experts.local_experts();
  s.local_begin = std::accumulate(counts.begin(), counts.begin() + first, int64_t(0));
  std::vector<int64_t> local(counts.begin() + first, counts.begin() + first + n);
  s.local_rows = std::accumulate(local.begin(), local.end(), int64_t(0));
  s.expert_out = ctx.empty(permuted.shape(), permuted.dtype());
  if (s.local_rows != R) ops::fill(ctx, s.expert_out, 0.0);  // other ranks' experts, and no slot at all
  const int64_t b = s.local_begin, e = s.local_begin + s.local_rows;
  s.experts = experts.forward(ctx, s.expert_out.slice(b, e), permuted.slice(b, e), std::move(local));
}

void MoELayer::experts_all_to_all(Context& ctx, MoESaved& s, const Tensor& permuted,
                                  const std::vector<int32_t>& counts, Timers* timers) const {
  auto plan = std::make_shared<const AllToAllPlan>(*parallel_.ep, counts, timers);
  Tensor grouped = plan->dispatch(ctx, permuted);
  std::vector<int64_t> counts_local = plan->local_counts();
  if (parallel_.expert_tp != nullptr && parallel_.expert_tp->size() > 1) {
    s.etp = std::make_shared<const ExpertTpExchange>(*parallel_.expert_tp, counts_local);
    grouped = s.etp->gather(ctx, grouped);
    counts_local = s.etp->gathered_counts();
  }
  Tensor expert_y = ctx.empty(grouped.shape(), grouped.dtype());
  s.experts = experts.forward(ctx, expert_y, grouped, std::move(counts_local));
  if (s.etp) expert_y = s.etp->reduce_scatter(ctx, expert_y);  // the shards' partial sums, own rows
  const Tensor back = plan->combine(ctx, expert_y);
  s.expert_out = ctx.empty(permuted.shape(), permuted.dtype());
  s.local_begin = 0;
  s.local_rows = plan->send_rows();
  if (s.local_rows != permuted.dim(0)) ops::fill(ctx, s.expert_out, 0.0);  // slots no expert took
  ops::copy(ctx, s.expert_out.slice(0, s.local_rows), back);
  s.plan = std::move(plan);
}

void MoELayer::experts_backward(Context& ctx, MoESaved& s, const Tensor& dpermuted, const Tensor& dexpert_out) {
  const int64_t R = dpermuted.dim(0), b = s.local_begin, e = s.local_begin + s.local_rows;
  if (s.local_rows != R) ops::fill(ctx, dpermuted, 0.0);
  if (!s.plan) {
    experts.backward(ctx, std::move(s.experts), dpermuted.slice(b, e), dexpert_out.slice(b, e));
    return;
  }
  Tensor dgrouped = s.plan->dispatch(ctx, dexpert_out);
  if (s.etp) dgrouped = s.etp->gather(ctx, dgrouped);  // the adjoint of the forward's reduce-scatter
  Tensor dx_grouped = ctx.empty(dgrouped.shape(), dgrouped.dtype());
  experts.backward(ctx, std::move(s.experts), dx_grouped, dgrouped);
  if (s.etp) dx_grouped = s.etp->reduce_scatter(ctx, dx_grouped);  // and of its gather
  ops::copy(ctx, dpermuted.slice(b, e), s.plan->combine(ctx, dx_grouped));
}

void MoELayer::backward(Context& ctx, MoESaved&& saved, const Tensor& dx_out, const Tensor& dout_in,
                        double loss_grad_scale) {
  MoESaved s = std::move(saved);
  const int64_t T = s.tokens, h = dout_in.numel() / T, k = moe_.topk;
  if (s.shared_dropped) {  // selective "shared_experts": their forward again (before the router's input is released)
    Tensor pre = ctx.empty({T, h}, dout_in.dtype());
    s.shared = shared_experts->forward(ctx, pre, s.router.x);
    s.shared_out = pre;  // the gate's backward reads the pre-gate output
  }
  const Tensor dout = dout_in.view({T, h}), dx = dx_out.view({T, h});
  comm::Communicator* group = s.plan ? nullptr : parallel_.dispatch;
  const Tensor doutg = gather_rows(ctx, group, dout);
  const int64_t TG = doutg.dim(0), R = TG * k;
  Tensor dexpert_out = ctx.empty({R, h}, dout.dtype()), dprobs_g = ctx.empty({TG, k}, s.probs.dtype());
  ops::moe_unpermute_backward(ctx, dexpert_out, dprobs_g, doutg, s.expert_out, s.row_map, s.probs);
  s.expert_out = Tensor();
  Tensor dpermuted = ctx.empty({R, h}, dout.dtype());
  experts_backward(ctx, s, dpermuted, dexpert_out);
  Tensor dxg = group != nullptr && group->size() > 1 ? ctx.empty({TG, h}, dout.dtype()) : dx;
  ops::moe_permute_backward(ctx, dxg, dpermuted, s.row_map);
  if (dxg.data_ptr() != dx.data_ptr()) reduce_scatter_rows(ctx, group, dx, dxg);
  Tensor dprobs = dprobs_g;
  if (group != nullptr && group->size() > 1) {
    dprobs = ctx.empty({T, k}, s.probs.dtype());
    reduce_scatter_rows(ctx, group, dprobs, dprobs_g);
  }
  Tensor dx_router = ctx.empty({T, h}, dout.dtype());
  router.backward(ctx, std::move(s.router), dx_router, dprobs, loss_grad_scale);
  ops::add(ctx, dx, dx, dx_router);
  if (shared_experts) shared_backward(ctx, s, dx, dout);
}

void MoELayer::collect_parameters(ParameterList& out) {
  router.collect_parameters(out);
  if (shared_experts) shared_experts->collect_parameters(out);
  if (shared_gate.defined()) out.push_back(&shared_gate);
  experts.collect_parameters(out);
}

}  // namespace megatron::nn
