// finalize_model_grads: everything between the last backward of an iteration and the optimizer, Megatron's
// finalize_model_grads (megatron/core/distributed/finalize_model_grads.py), in its order:
//   1. finish the data-parallel reduction (DistributedDataParallel::finish_grad_sync: the average over DP, or
//      with the distributed optimizer the reduce-scatter into this rank's shards);
//   2. sum over TP the gradients that are partial sums there (placement.grad_partial_over_tp: the norms under
//      sequence parallelism, which saw only their token rows), all of them packed into one all-reduce;
//   3. sum the shared embeddings' gradients (placement.shared_embedding: the first pipeline stage's word
//      embeddings and the last stage's tied copy) over the embedding group, so both copies take the same step.
// Expert parameters (placement.expert) are reduced over their expert-data-parallel group in step 1
// (distributed_data_parallel.h: the sum over expert-DP divided by DP x CP).
// The reductions are sums, so their order does not change the result; with the distributed optimizer only
// this rank's shard of each bucket is meaningful after step 1, and steps 2-3 keep it so: the ranks of a TP group
// have the same buffer layout, and a shared embedding has a bucket of its own on both pipeline stages
// (param_and_grad_buffer.h), so each rank of a group owns the same shard positions of what is summed. With
// FSDP's sharded gradients only those shard positions exist (DistributedDataParallel::held_grad), and steps 2-3
// sum just them.
#pragma once

#include "megatron/comm/communicator.h"
#include "megatron/distributed/distributed_data_parallel.h"
#include "megatron/nn/parameter.h"
#include "megatron/runtime/timers.h"

namespace megatron::distributed {

struct ModelGradGroups {
  comm::Communicator* tensor_parallel = nullptr;  // the TP group (step 2); null or size 1: nothing to do
  comm::Communicator* embedding = nullptr;        // first + last pipeline stage (step 3); null: not a member
};

// `params`: this rank's model parameters (every chunk's). Collective over the groups (every rank calls it).
// `timers` (may be null): Megatron's all-grads-sync (step 1), layernorm-grads-all-reduce (step 2) and
// embedding-grads-all-reduce (step 3), level 1.
void finalize_model_grads(Context& ctx, DistributedDataParallel& ddp, const nn::ParameterList& params,
                          const ModelGradGroups& groups, Timers* timers = nullptr);

// Whether steps 2-3 still change p's gradient after its data-parallel reduction (step 1): what reads a bucket's
// gradients as soon as it is reduced must leave such a parameter's alone.
inline bool grad_changes_after_reduction(const nn::Parameter& p) {
  return p.placement.grad_partial_over_tp || p.placement.shared_embedding;
}

// Sums the main grads of `params` over `group` with one all-reduce of their packed values (ctx's stream).
void all_reduce_grads(Context& ctx, const nn::ParameterList& params, comm::Communicator& group);

}  // namespace megatron::distributed
