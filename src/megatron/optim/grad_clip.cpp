#include "megatron/optim/grad_clip.h"

#include <cmath>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/optimizer/optimizer.h"

namespace megatron::optim {
namespace {

float read_scalar(Context& ctx, const Tensor& t) {
  float value = 0.0f;
  copy_tensor(ctx, Tensor::from_blob(&value, Shape{1}, DType::F32, Device::cpu()), t);  // waits for the copy
  return value;
}

}  // namespace

double global_grad_norm(Context& ctx, const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  Tensor norm = ctx.empty(Shape{1}, DType::F32);
  ops::multi_tensor_l2_norm(ctx, norm, Tensor(), grads);
  return double(read_scalar(ctx, norm));
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

GradPreparation prepare_grads(Context& ctx, const std::vector<Tensor>& grads, LossScaler* scaler, double clip_grad) {
  GradPreparation result;
  if (scaler != nullptr) {
    const bool found_inf = unscale_and_check_for_inf(ctx, grads, scaler->inv_scale());
    scaler->update(found_inf);
    if (found_inf) {
      result.skip_update = true;
      return result;
    }
  }
  if (clip_grad > 0.0) {
    const double total = global_grad_norm(ctx, grads);
    result.grad_norm = total;
    const double coeff = clip_grad / (total + 1.0e-6);
    if (coeff < 1.0) result.grad_scale = coeff;
  }
  return result;
}

}  // namespace megatron::optim
