// CUDA path of the router ops (arguments already validated by router.cpp / load_balancing.cpp; see
// router.h and load_balancing.h). No CUDA types here.
#pragma once

#include "megatron/ops/router/capacity.h"
#include "megatron/ops/router/router.h"
#include "megatron/ops/router/sinkhorn.h"

namespace megatron::ops::cuda {

void router_topk_forward(Context& ctx, const Tensor& probs, const Tensor& indices, const Tensor& scores,
                         const Tensor& logits, const Tensor& expert_bias, const RouterOptions& options);
void router_topk_backward(Context& ctx, const Tensor& dlogits, const Tensor& dprobs, const Tensor& scores,
                          const Tensor& indices, const Tensor& logits, const RouterOptions& options);
void router_topk_indices(Context& ctx, const Tensor& indices, const Tensor& scores);

void router_aux_scores(Context& ctx, const Tensor& aux_scores, const Tensor& logits, ScoreFunction f);
void router_aux_scores_backward(Context& ctx, const Tensor& dlogits, const Tensor& daux_scores, const Tensor& logits,
                                ScoreFunction f);
void expert_token_counts(Context& ctx, const Tensor& counts, const Tensor& indices, bool accumulate);
void router_z_loss_forward(Context& ctx, const Tensor& loss, const Tensor& logits);
void router_z_loss_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits, double coeff);
void router_expert_bias_update(Context& ctx, const Tensor& bias, const Tensor& counts, double rate);

void router_sinkhorn(Context& ctx, const Tensor& balanced, const Tensor& logits);
void router_scores_at(Context& ctx, const Tensor& probs, const Tensor& scores, const Tensor& indices);

void router_drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs);

}  // namespace megatron::ops::cuda
