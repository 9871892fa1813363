// Expert capacity: the token dropping of Megatron's apply_router_token_dropping (without padding), on the
// router's top-k output, on the device that holds it.
//
// router_drop_over_capacity(ctx, kept_probs, kept_indices, probs, indices, num_experts, capacity, by_probs)
//   probs [T, k] F32 (F64 on the CPU), indices [T, k] I32 with ids in [0, num_experts); kept_probs and
//   kept_indices the same shapes and dtypes, assigned, separate from the inputs. A slot is (t, s), numbered
//   t * k + s. Each expert keeps at most `capacity` of the slots routed to it and drops the rest (index -1,
//   probability 0; kept slots are copied):
//     by_probs:  the `capacity` highest probabilities (equal ones: the lower slot number first; NaN
//                probabilities are not allowed, the router never makes them);
//     otherwise: the `capacity` lowest slot numbers (the earliest tokens).
//   capacity >= 0. An id outside [0, num_experts) is an error on the CPU; on CUDA that slot is copied as it is
//   (the device cannot report without a synchronisation). CPU and CUDA give identical outputs. T == 0 is a
//   no-op. The CUDA path needs no host synchronisation (cuda_capacity.cu); ranking by probability compares
//   each of an expert's slots with its others, O(n_e^2) for n_e slots routed to it, spread over n_e / 1024
//   blocks.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops {

void router_drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs);

}  // namespace megatron::ops
