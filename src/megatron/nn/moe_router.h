// TopKRouter: the router of a Mixture-of-Experts layer (Megatron-core's TopKRouter), with its load-balancing
// and z losses.
//
//   logits = x W^T            W [E, h] (replicated over TP; under sequence parallelism each TP rank routes its
//                             own token rows, so W's gradient is a partial sum over TP), fp32 logits
//   probs, indices = top-k routing of logits (ops/router: softmax / sigmoid / sqrtsoftplus, pre-softmax,
//                             device-limited groups, scaling factor)
// Losses (training only), whose gradients the backward adds into d(logits); their values are recorded for
// the log line (metrics()):
//   aux_loss          E * coeff / (k * T_tot^2) * sum_e (sum over local tokens of A[t, e]) * counts_e, with A
//                     Megatron's scores_for_aux_loss, counts the top-k selections of A summed over TP x CP,
//                     T_tot = local tokens x |TP x CP| (each rank holds its share of the full loss);
//   global_aux_loss   the same with counts summed over TP x DP x CP (T_tot likewise);
//   seq_aux_loss      per sequence b of the micro-batch: the same with sums, counts and T_tot (the sequence's
//                     length over CP) of that sequence only, averaged over the B sequences;
//   z_loss            coeff / |TP x CP| * mean over local tokens of logsumexp(logits)^2.
// With the expert bias, the selection is made on scores + bias; the probabilities stay the unbiased scores.
// With Sinkhorn routing (moe_sinkhorn.h) training forwards select by the balanced costs instead.
// Gradient scale: backward(..., loss_grad_scale) multiplies the losses' gradients by loss_grad_scale, which
// the caller sets so that the losses enter the gradient exactly as the main loss does: 1 / micro-batches
// (the main loss's scale, times the fp16 loss scale) times CP, because the data-parallel reduction averages
// over DP x CP while the CP ranks hold parts of one loss -- so the losses' gradients do not change with TP,
// CP, PP or the micro-batch count.
#pragma once

#include <string>
#include <vector>

#include "megatron/nn/linear.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/ops/router/router.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

// The process groups the router's statistics are summed over (null: this rank alone).
struct RouterGroups {
  comm::Communicator* tp_cp = nullptr;     // ranks holding parts of the same sequences
  comm::Communicator* tp_dp_cp = nullptr;  // global_aux_loss's counts
  int tp_cp_size = 1;
  int cp_size = 1;  // a sequence's tokens are spread over CP
  int tp_dp_cp_size = 1;
};

// Where a router's T token rows sit among the micro-batch's sequences (the sequence-level aux loss needs it):
// the rows are rows [first_row, first_row + T) of the [b, seq] rows of the sequence-parallel region (seq: each
// sequence's tokens on this rank under context parallelism; seq 0: the rows are one sequence).
struct TokenRows {
  int64_t seq = 0;
  int64_t first_row = 0;
  int64_t total_rows = 0;  // the rows of every TP rank together (0: this rank's T)
};

struct RouterSaved {
  Tensor x;                    // the router's input [T, h]
  Tensor logits;               // [T, E] F32 (F64 with F64 parameters)
  Tensor scores;               // [T, E] the routing op's saved scores
  Tensor indices;              // [T, k] I32
  std::vector<Tensor> counts;  // per configured aux loss: its counts [E] ([B, E] for seq_aux_loss), summed
  std::vector<double> token_totals;
  TokenRows rows;              // seq_aux_loss: the sequences of the rows
};

// Per-layer metrics (device F32 [kMetrics]) summed over forwards: see MoELayer::metrics().
inline constexpr int kRouterMetrics = 4;  // load_balancing_loss, global_load_balancing_loss, z_loss, seq_load_balancing_loss
const char* router_metric_name(int i);

class TopKRouter {
 public:
  TopKRouter() = default;
  TopKRouter(Context& ctx, const std::string& name, const TransformerConfig& config, const parallel::TensorParallel& tp,
             RouterGroups groups);

  void init(Context& ctx, const TransformerConfig& config);
  // x [T, h] -> probs [T, k] F32 (F64), indices [T, k] I32, both assigned.
  // record (training only): add the forward's tokens to the expert bias's counts and its losses to metrics();
  // false when full recomputation runs the same forward a second time, which must not count them twice.
  [[nodiscard]] RouterSaved forward(Context& ctx, const Tensor& probs, const Tensor& indices, const Tensor& x,
                                    bool training, const TokenRows& rows = {}, bool record = true) const;
  // Aux-loss-free balancing (--moe-router-enable-expert-bias, Megatron's get_updated_expert_bias): once per
  // step, the expert counts this router's training forwards made since the last update, summed over TP x DP x
  // CP, move the bias: b_e += rate * sign(mean(counts) - counts_e). Collective over that group; no-op
  // without the bias.
  void update_expert_bias(Context& ctx);

  // dprobs [T, k]; dx [T, h] assigned; W's main grad accumulated; the losses' gradients added (see above).
  void backward(Context& ctx, RouterSaved&& saved, const Tensor& dx, const Tensor& dprobs, double loss_grad_scale);
  void collect_parameters(ParameterList& out);

  // The losses' values recorded by training forwards since the last reset: [load_balancing_loss,
  // global_load_balancing_loss, z_loss] as each rank's share (a sum over all ranks, divided by DP x
  // micro-batches, gives Megatron's logged value for this layer). Undefined before the first forward.
  const Tensor& metrics() const { return metrics_; }
  void reset_metrics(Context& ctx);

  Parameter weight;
  // With --moe-router-enable-expert-bias: the selection bias [E] F32, only moved by update_expert_bias. It is a
  // parameter whose gradient is always zero (so the optimizer leaves it as it is: an fp32 parameter is its own
  // master, zero moments give a zero step, 1-D parameters take no weight decay) and so travels with the model
  // through data parallelism and checkpoints under Megatron's key `...router.expert_bias`.
  Parameter expert_bias;

 private:
  // seq_aux_loss: the per-sequence counts [B, E] (summed over TP x CP) and this rank's share of loss / coeff
  // added to the metric slot of `metrics` (metrics_, or a recomputed forward's scratch).
  Tensor sequence_counts(Context& ctx, const Tensor& aux, const Tensor& aux_indices, const TokenRows& rows,
                         const Tensor& metrics) const;
  void add_sequence_aux_grad(Context& ctx, const Tensor& dlogits, const RouterSaved& s, const Tensor& counts,
                             double factor) const;

  ops::RouterOptions options_;
  MoeConfig moe_;
  RouterGroups groups_;
  mutable Tensor metrics_;
  mutable Tensor local_counts_;  // expert selections since the last bias update [E] F32
};

}  // namespace megatron::nn
