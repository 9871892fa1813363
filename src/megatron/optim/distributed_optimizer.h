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
//
// Weights kept in FP8 (--fp8-param-gather, param_and_grad_buffer.h's FP8 storage), as Megatron with Transformer
// Engine's FP8 parameters: their fp32 masters, taken from the values before the move, are the only
// high-precision copy and AdamW updates them like fp32 parameters; after every update (and at construction, and
// after a checkpoint load: requantize_fp8_params) each rank quantises its shards of them straight into the FP8
// buffer with the weight's scale and the FP8 bytes are all-gathered: half the bf16 traffic, and no bf16 weight
// anywhere. The scale follows the recipe (Fp8ParamScaling): delayed scaling casts with the weight's current
// scale and max-accumulates its shard's amax into the history slot (the trainer's per-iteration reduction over
// TP x DP x CP completes it, as the forward's cast of a bf16 weight would have); current scaling reduces the
// shards' amaxes (max) over the buffer's data-parallel group and the TP group first, so every rank casts with
// the whole tensor's scale. Each parameter's fp8_scale_inv is set to what dequantises its new values.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "megatron/optim/adamw.h"
#include "megatron/runtime/timers.h"
#include "megatron/distributed/distributed_data_parallel.h"

namespace megatron::optim {

// How the masters of one weight kept in FP8 become its values (see above); the trainer builds one per such
// weight from its linear's scaling state (nn/fp8_scaling_state.h).
struct Fp8ParamScaling {
  const nn::Parameter* param = nullptr;
  // Delayed scaling: the scale to cast with, its inverse, and the amax history slot (F32 [1] views of the
  // state). All undefined with current scaling.
  Tensor scale, scale_inv, amax;
  // Current scaling: the TP group the weight is split over (null or size 1: none), the format's largest value
  // and the margin (scale = fp8_max / amax / 2^margin), the same for every weight.
  comm::Communicator* split_group = nullptr;
  float fp8_max = 448.0f;
  float margin = 0.0f;
};

class DistributedOptimizer {
 public:
  // fp8_params: one entry per parameter of ddp kept in FP8 (none without --fp8-param-gather).
  DistributedOptimizer(Context& ctx, distributed::DistributedDataParallel& ddp, const AdamWOptions& options = {},
                       bool overlap_param_gather = false, std::vector<Fp8ParamScaling> fp8_params = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // This rank's shard of every bucket's gradients (valid after DDP's finish_grad_sync).
  const std::vector<Tensor>& grad_shards() const { return grad_shards_; }
  // The same elements per parameter: (parameter, its gradient elements inside this rank's shards), padding
  // left out (for norms that must skip some parameters).
  const std::vector<std::pair<const nn::Parameter*, Tensor>>& param_grad_shards() const { return param_grad_shards_; }
  // AdamW on the shards (gradients multiplied by grad_scale first; decoupled_lr as AdamW::step takes it, for the
  // shards of the word embeddings and the output layer), then the all-gather of the values.
  // `timers` (may be null): Megatron's optimizer-inner-step and params-all-gather (level 1; with
  // --overlap-param-gather the gathers run on their own stream and the timer sees only their launch).
  void step(Context& ctx, double lr, double weight_decay, float grad_scale = 1.0f, Timers* timers = nullptr,
            std::optional<double> decoupled_lr = std::nullopt);
  void wait_for_params(Context& ctx, const nn::ParameterList& params);
  void finish_param_gather(Context& ctx);
  // The weights kept in FP8 quantised again from their masters and gathered (after a checkpoint load has
  // replaced the masters or the scaling state).
  void requantize_fp8_params(Context& ctx);

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
  // The all-gathers of every bucket's values (only_fp8: of the FP8 buffers' only).
  void gather(Context& ctx, bool only_fp8 = false);
  // This rank's shards of the weights kept in FP8, quantised from their masters (see above).
  void quantize_fp8_shards(Context& ctx);

  distributed::DistributedDataParallel& ddp_;
  std::unique_ptr<AdamW> adamw_;
  std::vector<Tensor> grad_shards_;
  std::vector<ParamRange> param_ranges_;  // parallel to adamw_'s entries
  std::vector<std::pair<const nn::Parameter*, Tensor>> param_grad_shards_;
  int64_t shard_elements_ = 0;
  // Weights kept in FP8: their scaling, and this rank's shards of them (the master AdamW updates, the FP8 range
  // of the buffer it is quantised into, which entry of fp8_params_ scales it).
  std::vector<Fp8ParamScaling> fp8_params_;
  struct Fp8Shard {
    size_t scaling = 0;
    Tensor master, values;
  };
  std::vector<Fp8Shard> fp8_shards_;
  comm::Communicator* fp8_group_ = nullptr;  // the data-parallel group of their buffer
  bool overlap_ = false;
  std::vector<std::vector<bool>> pending_;  // per buffer, per bucket: gathered but not yet waited for
  struct Streams;                           // CUDA: the gather stream and one event per bucket
  std::unique_ptr<Streams> streams_;
};

}  // namespace megatron::optim
