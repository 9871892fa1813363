#include "megatron/optim/grad_clip.h"

#include <cmath>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/optimizer/optimizer.h"

namespace megatron::optim {
double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  Tensor norm = ctx.empty(Shape{1}, DType::F32);
  ops::multi_tensor_l2_norm(ctx, norm, Tensor(), grads);
  return read_scalar(ctx, norm);
}

double clip_grads_by_total_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, double total_norm) {
  const double coeff = max_norm / (total_norm + 1.0e-6);
  if (!(coeff < 1.0)) return 1.0;
  if (!grads.empty()) ops::multi_tensor_scale(ctx, grads, Tensor(), grads, float(coeff));
  return coeff;
}

double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm) {
  const double total = global_grad_norm(ctx, grads);
  clip_grads_by_total_norm(ctx, grads, max_norm, total);
  return total;
}

bool unscale_and_check_for_inf(Context& ctx, const std::vector<Tensor>& grads, float inv_scale) {
  if (grads.empty()) return false;
  Tensor found_inf = ctx.empty(Shape{1}, DType::F32);
  ops::fill(ctx, found_inf, 0.0);
  ops::multi_tensor_scale(ctx, grads, found_inf, grads, inv_scale);
  return read_scalar(ctx, found_inf) != 0.0f;
}

namespace {

// Each rank's sum of g^2 over `grads`, summed over every group of `groups`.
double squared_norm(Context& ctx, const std::vector<Tensor>& grads, const std::vector<comm::Communicator*>& groups) {
  const double local = global_grad_norm(ctx, grads);
  double squared[1] = {local * local};
  for (comm::Communicator* group : groups)
    if (group != nullptr) group->all_reduce_host(squared, comm::ReduceOp::Sum);
  return squared[0];
}

}  // namespace

double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, const GradStatsGroups& groups) {
  return global_grad_norm(ctx, grads, {}, groups);
}

double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, const std::vector<Tensor>& expert_grads,
                        const GradStatsGroups& groups) {
  if (groups.expert_norm_groups.empty()) {
    std::vector<Tensor> all = grads;
    all.insert(all.end(), expert_grads.begin(), expert_grads.end());
    return std::sqrt(squared_norm(ctx, all, groups.norm_groups));
  }
  return std::sqrt(squared_norm(ctx, grads, groups.norm_groups) +
                   squared_norm(ctx, expert_grads, groups.expert_norm_groups));
}

GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad) {
  return prepare_grads(ctx, grads, scaler, clip_grad, GradStatsGroups{});
}

GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups) {
  return prepare_grads(ctx, grads, scaler, clip_grad, groups, grads);
}

GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups, const std::vector<Tensor>& norm_grads) {
  return prepare_grads(ctx, grads, scaler, clip_grad, groups, norm_grads, {});
}

GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad,
                              const GradStatsGroups& groups, const std::vector<Tensor>& norm_grads,
                              const std::vector<Tensor>& expert_norm_grads, Timers* timers) {
  GradPreparation result;
  if (scaler != nullptr) {
    TimerScope timer(timers, "optimizer-unscale-and-check-inf", 1);
    bool found_inf = unscale_and_check_for_inf(ctx, grads, scaler->inv_scale());
    if (groups.found_inf_group != nullptr) {  // one rank's overflow skips the step everywhere
      double flag[1] = {found_inf ? 1.0 : 0.0};
      groups.found_inf_group->all_reduce_host(flag, comm::ReduceOp::Max);
      found_inf = flag[0] != 0.0;
    }
    scaler->update(found_inf);
    if (found_inf) {
      result.skip_update = true;
      return result;
    }
  }
  if (clip_grad > 0.0) {
    TimerScope timer(timers, "optimizer-clip-main-grad", 1);
    const double total = global_grad_norm(ctx, norm_grads, expert_norm_grads, groups);
    result.grad_norm = total;
    const double coeff = clip_grad / (total + 1.0e-6);
    if (coeff < 1.0) result.grad_scale = coeff;
  }
  return result;
}

}  // namespace megatron::optim
