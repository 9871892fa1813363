// MoELayer: the Mixture-of-Experts MLP slot of a transformer layer (Megatron-core's MoELayer with the
// allgather token dispatcher): route, dispatch, run the local experts, combine.
//
//   probs, idx = router(x)                       x [T, h]: this rank's token rows (under sequence parallelism
//                                                1/TP of them), probs/idx [T, k]
//   X, P, I    = all-gather of x, probs, idx over the expert TP x EP group (G ranks; G = 1: this rank's own)
//   rows       = permute(X by I)                 grouped by expert, expert ascending, token ascending
//   y_rows     = local experts on their rows     (the other experts' rows stay 0 on this rank)
//   Y          = unpermute(y_rows, P)            Y[t] = sum_s P[t, s] * y_rows[row(t, s)]
//   out        = reduce-scatter(Y) over G (+ the shared experts' MLP of x; with --moe-shared-expert-gate times
//                sigmoid(x . gate_weight) per token, Megatron's SharedExpertMLP gate, gate_weight [1, h])
// Each rank holds E / EP experts split over expert TP, so its Y is a partial sum; the reduce-scatter adds
// the experts of the other EP ranks and the other expert-TP shards and hands every rank its own rows back.
// The backward mirrors it: all-gather dout, unpermute's backward (d rows and d probs), the experts'
// backward on the local rows, permute's backward, reduce-scatter of d x and d probs, the router's backward.
// The expert counts are copied to the host once per forward (the grouped GEMM launches from host shapes,
// as Megatron's does).
// With --moe-token-dispatcher-type alltoall and EP > 1, each rank instead sends every EP rank only the rows
// of its experts (moe_all_to_all.h) and gets them back after the experts; with expert TP the peers then
// gather each other's rows for their weight shards and sum the partial outputs back. The result is the
// same function.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/nn/mlp.h"
#include "megatron/nn/moe_all_to_all.h"
#include "megatron/nn/moe_experts.h"
#include "megatron/nn/moe_router.h"

namespace megatron::nn {

// The parallel side of an MoE layer: the expert layout, the dispatch group and the router's groups.
struct MoeParallel {
  ExpertLayout experts;
  comm::Communicator* dispatch = nullptr;  // allgather: expert TP x EP (null or size 1: no communication)
  comm::Communicator* ep = nullptr;        // alltoall: the expert-parallel group
  comm::Communicator* expert_tp = nullptr; // alltoall: the expert-tensor-parallel group
  RouterGroups router;
};

struct MoESaved {
  RouterSaved router;
  Tensor probs;     // [G T, k] the gathered routing probabilities
  Tensor row_map;   // [G T, k]
  Tensor expert_out;  // allgather: [G T k, h], the local experts' rows, zero elsewhere; alltoall: [T k, h]
  int64_t local_begin = 0, local_rows = 0;
  std::shared_ptr<const AllToAllPlan> plan;  // alltoall: the exchange's sizes
  std::shared_ptr<const ExpertTpExchange> etp;  // alltoall with expert TP: the peers' row counts
  ExpertsSaved experts;
  MLPSaved shared;
  bool shared_dropped = false;  // selective "shared_experts": `shared` is made again by the backward
  // --moe-shared-expert-gate: the gate's input x, logits [T, 1], sigmoid scores [T, 1] (F32; F64 for F64
  // models), the router op's index column [T, 1] (all 0) and the shared experts' output before the gate
  // [T, h] (undefined when dropped: the backward makes it again).
  Tensor gate_x, gate_logits, gate_scores, gate_index, shared_out;
  int64_t tokens = 0;  // T
};

class MoELayer {
 public:
  MoELayer() = default;
  MoELayer(Context& ctx, const std::string& prefix, const TransformerConfig& config, const parallel::TensorParallel& tp,
           const MoeParallel& parallel);

  void init(Context& ctx, const TransformerConfig& config);
  // x [T, h] -> out [T, h] assigned.
  // rows: where x's rows sit among the micro-batch's sequences (the sequence-level aux loss).
  // timers (null: none): the alltoall dispatcher's exchanges, forward and backward (AllToAllPlan).
  // recomputing: full recomputation's second forward (the router records nothing again: TopKRouter::forward).
  [[nodiscard]] MoESaved forward(Context& ctx, const Tensor& out, const Tensor& x, bool training,
                                 const TokenRows& rows = {}, Timers* timers = nullptr, bool recomputing = false) const;
  // dx assigned; main grads accumulated; loss_grad_scale: the router losses' gradient scale (moe_router.h).
  void backward(Context& ctx, MoESaved&& saved, const Tensor& dx, const Tensor& dout, double loss_grad_scale);
  void collect_parameters(ParameterList& out);
  bool defined() const { return router.weight.defined(); }

  TopKRouter router;
  GroupedExperts experts;
  std::unique_ptr<MLP> shared_experts;  // with --moe-shared-expert-intermediate-size
  Parameter shared_gate;                // with --moe-shared-expert-gate: [1, h], replicated over TP

 private:
  bool all_to_all() const;
  // The dispatch, experts and combine of each dispatcher: rows = this rank's permuted slots [T k, h]
  // (allgather: over the dispatch group) -> s.expert_out, whose unpermute gives the layer's output.
  void experts_all_gather(Context& ctx, MoESaved& s, const Tensor& permuted, const std::vector<int32_t>& counts) const;
  void experts_all_to_all(Context& ctx, MoESaved& s, const Tensor& permuted, const std::vector<int32_t>& counts,
                          Timers* timers) const;
  // Their backward: d expert_out -> d permuted (assigned).
  void experts_backward(Context& ctx, MoESaved& s, const Tensor& dpermuted, const Tensor& dexpert_out);

  // The shared experts' output of x (into `out` [T, h]), gated when --moe-shared-expert-gate: the gate's state
  // into s; shared_out is the pre-gate output.
  void shared_forward(Context& ctx, MoESaved& s, const Tensor& out, const Tensor& x, bool training) const;
  // Their backward: dx += the shared experts' and the gate's input gradients.
  void shared_backward(Context& ctx, MoESaved& s, const Tensor& dx, const Tensor& dout);

  MoeParallel parallel_;
  MoeConfig moe_;
  bool recompute_shared_ = false;  // selective "shared_experts" (recompute.h)
};

}  // namespace megatron::nn
