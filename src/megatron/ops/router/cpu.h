// CPU reference of the router ops (arguments already validated by router.cpp / load_balancing.cpp; see
// router.h and load_balancing.h for the contracts). Plain loops over rows, fp32 math (fp64 for F64 logits).
#pragma once

#include "megatron/ops/router/capacity.h"
#include "megatron/ops/router/router.h"
#include "megatron/ops/router/sinkhorn.h"

namespace megatron::ops::cpu {

void router_topk_forward(const Tensor& probs, const Tensor& indices, const Tensor& scores, const Tensor& logits,
                         const Tensor& expert_bias, const RouterOptions& options);
void router_topk_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& scores, const Tensor& indices,
                          const Tensor& logits, const RouterOptions& options);
void router_topk_indices(const Tensor& indices, const Tensor& scores);

void router_aux_scores(const Tensor& aux_scores, const Tensor& logits, ScoreFunction f);
void router_aux_scores_backward(const Tensor& dlogits, const Tensor& daux_scores, const Tensor& logits,
                                ScoreFunction f);
void expert_token_counts(const Tensor& counts, const Tensor& indices, bool accumulate);
void router_z_loss_forward(const Tensor& loss, const Tensor& logits);
void router_z_loss_backward(const Tensor& dlogits, const Tensor& logits, double coeff);
void router_expert_bias_update(const Tensor& bias, const Tensor& counts, double rate);

void router_sinkhorn(const Tensor& balanced, const Tensor& logits);
void router_scores_at(const Tensor& probs, const Tensor& scores, const Tensor& indices);

void router_drop_over_capacity(const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs);

}  // namespace megatron::ops::cpu
