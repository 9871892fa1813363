// Sinkhorn routing (Megatron's --moe-router-load-balancing-type sinkhorn, TopKRouter.sinkhorn_load_balancing):
// in training the experts are chosen by the top-k of the Sinkhorn-balanced exp(logits) -- alternately
// normalising the rows and columns of exp(logits) over this router's tokens until the column scale changes by
// less than 1e-4 on average -- while the gates are the plain activation of the logits at the chosen experts
// (sigmoid for top-1, the softmax over all experts for top-k > 1), not renormalised. Outside training the
// experts are the top-k of the activation itself (the router's usual path).
// On the device that holds the logits (ops/router/sinkhorn.h: one cooperative CUDA launch iterates to
// convergence, no host round trip), in fp32 as Megatron's router (fp64 for F64 logits).
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::nn {

// logits, scores [T, E] (F32 or F64; scores = the activation of logits) -> indices [T, k] I32 (the top-k of
// the balanced costs, descending, ties to the lower expert) and probs [T, k] = scores at those experts.
void sinkhorn_select(Context& ctx, const Tensor& indices, const Tensor& probs, const Tensor& logits,
                     const Tensor& scores);

}  // namespace megatron::nn
