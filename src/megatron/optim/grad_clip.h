// Gradient conditioning between backward and the optimizer step, Megatron-LM's
// MixedPrecisionOptimizer.step order (megatron/core/optimizer/optimizer.py, clip_grads.py):
//   1. with a loss scaler: grads *= inv_scale, in place, noting any inf/NaN result; scaler.update(found_inf);
//      found_inf skips the step (no clipping, no optimizer update, the lr schedule does not advance);
//   2. clip_grad > 0: total = sqrt(sum of g^2 over every element of every gradient);
//      coeff = clip_grad / (total + 1e-6); grads *= coeff only when coeff < 1 (a NaN/inf total never clips);
//   3. the optimizer step.
// prepare_grads does not apply the clip coefficient itself: it returns it (grad_scale) for the optimizer to
// multiply in as it reads each gradient (AdamW::step's grad_scale), which saves a read and a write of every
// gradient; the product g * coeff is the same fp32 value either way.
// The norm is the one of the unscaled, unclipped gradients, reduced in fp32 on the device and read back
// as a double (Megatron's .item()). Every gradient lives on ctx's device; dtypes F32, BF16 or F16
// (F64 on the CPU). Functions returning host values synchronise ctx.
//
// Across ranks (GradStatsGroups): each rank passes the gradients it holds that no other rank of the norm
// groups holds too (the replicated optimizer: the whole reduced gradients, identical over DP, so DP is not a
// norm group; the distributed optimizer: its shards, so DP is one). The squared norms are summed over each
// norm group in turn (sum over the product of the groups), found_inf is max-reduced over found_inf_group,
// so every rank computes the same norm and takes the same skip decision. The norm groups must partition the
// gradient elements: that is how replicated parameters are counted once.
// Expert parameters (Megatron's separate expert optimizer in a ChainedOptimizer): their squares are summed over
// expert_norm_groups (the expert model-parallel group, expert TP x EP x PP, plus expert-DP with the
// distributed optimizer) and added to the dense ones: total = sqrt(dense + expert).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/optim/loss_scaler.h"
#include "megatron/runtime/context.h"
#include "megatron/runtime/timers.h"

namespace megatron::optim {

// sqrt(sum over all gradients and elements of g^2); 0 for an empty list. NaN/inf propagate.
double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads);

// Scales every gradient by max_norm / (total_norm + 1e-6) when that is < 1; returns the coefficient
// applied (1 when none).
double clip_grads_by_total_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, double total_norm);

// global_grad_norm, then clip_grads_by_total_norm; returns the norm before clipping.
double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm);

// grads *= inv_scale in place (product in fp32, rounded to each gradient's dtype); true when any result
// is inf or NaN.
bool unscale_and_check_for_inf(Context& ctx, const std::vector<Tensor>& grads, float inv_scale);

struct GradStatsGroups {
  std::vector<comm::Communicator*> norm_groups;    // squared norm summed over each (none: single rank)
  comm::Communicator* found_inf_group = nullptr;   // found_inf max-reduced here (none: single rank)
  // The expert gradients' squared norm summed over each. Every rank passes the same list, so a rank holding no
  // expert parameter (a dense pipeline stage) still joins the reductions; empty: the expert squares, if any,
  // are summed over norm_groups like the dense ones.
  std::vector<comm::Communicator*> expert_norm_groups;
};

// sqrt of the sum over the norm groups of each rank's sum of g^2 over `grads`.
double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, const GradStatsGroups& groups);
// sqrt(dense + expert): the squares of `grads` summed over groups.norm_groups plus those of `expert_grads`
// summed over groups.expert_norm_groups.
double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, const std::vector<Tensor>& expert_grads,
                        const GradStatsGroups& groups);

struct GradPreparation {
  bool skip_update = false;          // found inf/NaN: do not step the optimizer or the lr schedule
  std::optional<double> grad_norm;   // the pre-clip norm; none when skipped or clip_grad == 0 (Megatron: None)
  double grad_scale = 1.0;           // the clip coefficient (1 when not clipping), still to be applied
};

// Steps 1 and 2 above (the clip coefficient returned, not applied). `scaler` may be null (bf16 / fp32: no unscaling, never skipped).
GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad);
// The same across ranks: found_inf and the norm reduced over `groups` (see the top of this file).
GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups);
// The same with the norm taken over `norm_grads` instead of `grads`: views of them that leave out what another
// rank of the norm groups holds too (tensor parallelism: parameters replicated over TP count on TP rank 0
// only, Megatron's param_is_not_tensor_parallel_duplicate), so the groups still partition the elements.
// Unscaling and the inf check cover all of `grads`.
GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups, const std::vector<Tensor>& norm_grads);
// The same with the expert parameters' norm views apart (`norm_grads` then holds the dense ones only): the
// norm is global_grad_norm(norm_grads, expert_norm_grads, groups).
// `timers` (may be null) time Megatron's optimizer-unscale-and-check-inf and optimizer-clip-main-grad (level 1;
// the clip timer covers the norm: the coefficient is applied by the optimizer as it reads the gradients).
GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups, const std::vector<Tensor>& norm_grads,
                              const std::vector<Tensor>& expert_norm_grads, Timers* timers = nullptr);

// Skipped-iteration bookkeeping for the log line ("number of skipped iterations" per interval) and the
// run's total.
class SkippedIterations {
 public:
  void record(bool skipped) {
    if (skipped) ++total_, ++interval_;
  }
  int64_t total() const { return total_; }
  int64_t interval() const { return interval_; }
  // The count since the last call (or the start), then resets it: call once per log line.
  int64_t take_interval() {
    int64_t n = interval_;
    interval_ = 0;
    return n;
  }

 private:
  int64_t total_ = 0;
  int64_t interval_ = 0;
};

}  // namespace megatron::optim
