// Expert capacity (Megatron's apply_router_token_dropping without padding): each expert takes at most
// C = ceil(T * k / E * capacity_factor) of the T tokens this router saw; the slots beyond it are dropped
// (their index becomes -1 and their probability 0, so they leave the dispatch and contribute nothing).
//   drop policy probs:     each expert keeps its C highest-probability slots (ties: the earlier token);
//   drop policy position:  each expert keeps its C earliest tokens.
// When C >= T nothing is dropped (Megatron's shortcut). Token order is this rank's row order (Megatron's
// [s, b] order for one sequence per micro-batch). With --moe-pad-expert-input-to-capacity Megatron also runs
// the experts on C rows each, padding with zero-probability tokens: the result is the same function, so the
// padding is not materialised here.
// Computed where the router's output is (ops/router/capacity.h), with no host synchronisation on a GPU.
#pragma once

#include "megatron/nn/moe_config.h"
#include "megatron/runtime/context.h"

namespace megatron::nn {

// The capacity of each expert for `tokens` routed tokens.
int64_t expert_capacity(int64_t tokens, int topk, int num_experts, double capacity_factor);

// probs [T, k] F32/F64 and indices [T, k] I32 (the router's output) -> kept_probs, kept_indices (same shapes,
// assigned): dropped slots get probability 0 and index -1.
void drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                        const Tensor& indices, const MoeConfig& moe);

}  // namespace megatron::nn
