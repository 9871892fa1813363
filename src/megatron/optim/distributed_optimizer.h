// DistributedOptimizer: ZeRO-1, Megatron's distributed optimizer (megatron/core/optimizer/distrib_optimizer.py)
// over the buckets of a DistributedDataParallel built with use_distributed_optimizer.
//
// Each bucket of the contiguous buffers splits into DP equal shards (expert buffers: expert-DP shards, over
// DistributedDataParallel::group(buffer)); this rank owns shard number dp_rank of every bucket and keeps optimizer state only for the parameter elements inside it: fp32
// master weights (bf16/fp16 parameters; fp32 parameters update in place) and both Adam moments, i.e.
// 1/DP of the replicated optimizer's state. The update is one optim::AdamW over views of those ranges, so
// the arithmetic is exactly the replicated optimizer's.
//
// Per iteration: DDP reduce-scatters the gradients (each rank then holds the averaged gradients of its
// shards, grad_shards()); the caller unscales/clips those (the norm is summed over DP, see grad_clip.h);
// step() updates the shards, writing the new values into the parameter buffer, then all-gathers every
// bucket's values so every rank holds the whole updated model.
//
// Streams: without --overlap-param-gather the gathers are queued on ctx's stream. With it (CUDA) they are
// queued on a stream of this object, in forward order (last bucket first), each followed by an event;
// wait_for_params() -- the forward hook nn::ParamHooks::before_forward -- makes ctx's stream wait only for
// the buckets holding the parameters about to be used, so the gathers overlap the next forward.
// finish_param_gather() waits for all of them (before evaluation or checkpointing). On the CPU (MPI) the
// gathers complete inside step(): overlap is accepted and changes nothing.
// FSDP's sharded storage (distributed_data_parallel.h): the shards read and written are where the buffers keep
// them; with sharded values step() gathers nothing (each bucket is gathered where it is used).
#pragma once

#include <memory>
#include <vector>

#include "megatron/optim/adamw.h"
#include "megatron/distributed/distributed_data_parallel.h"

namespace megatron::optim {

class DistributedOptimizer {
 public:
  DistributedOptimizer(Context& ctx, distributed::DistributedDataParallel& ddp, const AdamWOptions& options = {},
                       bool overlap_param_gather = false);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // This rank's shard of every bucket's gradients (valid after DDP's finish_grad_sync).
  const std::vector<Tensor>& grad_shards() const { return grad_shards_; }
  // The same elements per parameter: (parameter, its gradient elements inside this rank's shards), padding
  // left out (for norms that must skip some parameters).
  const std::vector<std::pair<const nn::Parameter*, Tensor>>& param_grad_shards() const { return param_grad_shards_; }
  // AdamW on the shards (gradients multiplied by grad_scale first), then the all-gather of the values.
  void step(Context& ctx, double lr, double weight_decay, float grad_scale = 1.0f);
  void wait_for_params(Context& ctx, const nn::ParameterList& params);
  void finish_param_gather(Context& ctx);

  const AdamW& adamw() const { return *adamw_; }
  AdamW& adamw() { return *adamw_; }
  // What entry i of adamw() holds: elements [begin, end) of the flattened `param` (checkpoints save the
  // masters and moments as these ranges).
  struct ParamRange {
    const nn::Parameter* param = nullptr;
    int64_t begin = 0, end = 0;
  };
  const std::vector<ParamRange>& param_ranges() const { return param_ranges_; }
  // Bytes of optimizer state on this rank (masters and moments of its shards).
  size_t state_bytes() const { return adamw_->state_bytes(); }
  // Parameter elements this rank updates.
  int64_t shard_elements() const { return shard_elements_; }

 private:
  void gather(Context& ctx);

  distributed::DistributedDataParallel& ddp_;
  std::unique_ptr<AdamW> adamw_;
  std::vector<Tensor> grad_shards_;
  std::vector<ParamRange> param_ranges_;  // parallel to adamw_'s entries
  std::vector<std::pair<const nn::Parameter*, Tensor>> param_grad_shards_;
  int64_t shard_elements_ = 0;
  bool overlap_ = false;
  std::vector<std::vector<bool>> pending_;  // per buffer, per bucket: gathered but not yet waited for
  struct Streams;                           // CUDA: the gather stream and one event per bucket
  std::unique_ptr<Streams> streams_;
};

}  // namespace megatron::optim
