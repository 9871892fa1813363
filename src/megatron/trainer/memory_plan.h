// The memory a training run will need, before it runs (`pretrain_gpt ... --dry-run`): per pipeline rank, the
// model state (weights in the parameter dtype, fp32 main gradients, the optimizer's fp32 masters and moments,
// sharded by the distributed optimizer and partly in host memory with --optimizer-cpu-offload, FP8 weight
// copies) and the activations, from what this implementation's modules save for the backward (the saved
// tensors of nn/transformer_layer.h, attention.h, mlp.h and the linears, under TP/SP/CP, FP8 and
// recomputation), walked through the rank's actual pipeline schedule (pipeline/schedule.h) so the micro-batches
// in flight are counted exactly; the backward's working tensors and a full-recomputation unit rebuilt in the
// backward are added at the steps where they are live. The result is bytes as the allocator counts them
// ("peak allocated"), not including fragmentation (peak reserved) or the CUDA context.
//
// MoE layers too: the router, the routed rows and the experts' parameters (local experts under expert parallelism,
// their width under expert TP, their optimizer state sharded over the expert-data-parallel ranks). The routed
// rows are T x topk in all however the routing splits them, so the plan does not depend on it; capacity dropping,
// which keeps fewer, is not modelled (the plan then says so).
#pragma once

#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::trainer {

struct RankMemory {
  int pipeline_rank = 0;
  double weights = 0, main_grads = 0, optimizer = 0, optimizer_host = 0, fp8_weights = 0;  // bytes
  double model_state = 0;            // on the device: weights + grads + optimizer + FP8 copies
  double activations_per_microbatch = 0;  // what one micro-batch's forwards (all chunks) keep on this rank
  int max_in_flight = 0;             // the most (micro-batch, chunk) forwards awaiting their backward
  double peak_activations = 0;       // the schedule's peak above the model state
  double peak = 0;                   // model_state + peak_activations
};

struct MemoryPlan {
  std::vector<RankMemory> ranks;     // one per pipeline rank (TP, CP and DP ranks of a stage are alike)
  const RankMemory& worst() const;
  double most_host_bytes() const;  // the largest optimizer_host of any rank (pinned host memory)
  std::vector<std::string> notes;    // what the plan does not model for this configuration
};

// args: parsed, resolved and validated (resolve_and_validate), world_size set.
MemoryPlan plan_memory(const train::Arguments& args);

// The table --dry-run prints.
std::string describe(const MemoryPlan& plan, const train::Arguments& args);

}  // namespace megatron::trainer
