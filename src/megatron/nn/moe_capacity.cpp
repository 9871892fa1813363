#include "megatron/nn/moe_capacity.h"

#include <cmath>

#include "megatron/ops/router/capacity.h"

namespace megatron::nn {

int64_t expert_capacity(int64_t tokens, int topk, int num_experts, double capacity_factor) {
  return int64_t(std::ceil(double(tokens) * topk / num_experts * capacity_factor));
}

void drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                        const Tensor& indices, const MoeConfig& moe) {
  const int64_t capacity = expert_capacity(probs.dim(0), int(probs.dim(1)), moe.num_experts, moe.capacity_factor);
  // Megatron drops nothing when the capacity covers every token; no expert can then hold more slots anyway
  // (a token's k experts are distinct), so the op needs no shortcut.
  ops::router_drop_over_capacity(ctx, kept_probs, kept_indices, probs, indices, moe.num_experts, capacity,
                                 moe.drop_policy == TokenDropPolicy::Probs);
}

}  // namespace megatron::nn
