// DistributedDataParallel: gradient reduction over the data-parallel group, Megatron's DDP
// (megatron/core/distributed/distributed_data_parallel.py) with its bucketed, overlapped reduction.
//
// The model's parameters are grouped by dtype into ParamAndGradBuffers (their main_grads become views of
// one fp32 buffer, split into buckets in reverse parameter order). Per iteration:
//   zero_grads()            assigns 0 to every gradient buffer (the backward passes then accumulate +=);
//   on_grads_final(params)  the hook GPTModel's backward calls (nn::ParamHooks::grads_final) during the
//                           LAST micro-batch: once every parameter of a bucket is final, the bucket's
//                           reduction starts right away (--overlap-grad-reduce);
//   finish_grad_sync()      starts what has not started (everything, without overlap) and makes ctx's
//                           stream wait for all of it.
// The reduction averages over the group: all_reduce(Avg) of each bucket, or with the distributed
// optimizer reduce_scatter(Avg) into this rank's shard of each bucket (the rest of the buffer is then
// stale and must not be read). Every rank starts the buckets in the same order (bucket 0 first), which
// the backward order guarantees.
//
// Expert parameters (placement.expert) live in buffers of their own (per dtype, after the dense ones) that
// reduce over the expert-data-parallel group instead: the result is the SUM over expert-DP of the local
// gradients times 1 / |dp_group| (Megatron's expert_gradient_scaling_factor with dp_group = DP x CP: an expert
// sees the tokens of EP x expert-DP ranks, and the loss is averaged over DP x CP). When the two groups have the
// same size that is all_reduce(Avg); otherwise the bucket is pre-scaled by 1 / |dp_group| on ctx's stream
// (before the communication stream picks it up) and summed. With the distributed optimizer expert buffers are
// sharded over expert-DP (group(buffer) says which group a buffer's shards and reductions use).
//
// Streams: on CUDA with overlap, reductions are queued on a communication stream of this object that
// waits for ctx's stream (an event recorded when the bucket became ready); finish_grad_sync() makes ctx's
// stream wait for the communication stream; the host never waits. Without overlap they are queued on
// ctx's stream. On the CPU (MPI) each reduction completes inside the call that starts it, so "overlap"
// only changes when it runs (during backward rather than after it).
//
// Bucket size: --ddp-bucket-size elements; 0 = Megatron's default max(40M, 1M x DP) with overlap, one
// bucket per buffer without overlap.
//
// Megatron FSDP (--use-megatron-fsdp; DataParallelConfig::fsdp): one bucket per unit -- the parameter lists
// given as `units`, the groups a model uses together (GPTModel::parameter_groups: the embedding, each layer, the
// output head) -- and, by --data-parallel-sharding-strategy, only this rank's shard persists of each bucket's
// gradients (optim_grads) and also of its values (optim_grads_params); param_and_grad_buffer.h. Around each use
// of a unit (the model's ParamHooks, every forward and backward):
//   acquire_params(params)   all-gathers the buckets holding `params` from their shards (sharded values; a
//                            bucket already in use is only counted), and binds the Parameters' values to them;
//   release_params(params)   drops a bucket when its last user releases it, or with keep_values leaves it
//                            gathered for the next acquire (a recomputed forward's values kept for the backward
//                            that follows; finish_fsdp_step drops what is left);
//   begin_grads(params)      a zeroed whole gradient bucket for a backward to accumulate into (sharded gradients);
//   end_grads(params)        once its last user is done, reduce-scatters it into this rank's shard (+=) and drops it.
// So each micro-batch's backward reduces its gradients unit by unit (Megatron FSDP's per-micro-batch
// reduce-scatter) and finish_grad_sync() has nothing left to start. acquire_all_params / store_params /
// release_all_params serve checkpoints (the whole model bound, loaded values written back to the shards).
// Overlap on CUDA (fsdp.cpp): every FSDP collective runs on the communication stream, after the work ctx's stream
// has queued. With --overlap-param-gather, prefetch_params(params, forward) gathers the next module group in that
// direction (the neighbouring bucket) while the current one computes; with --overlap-grad-reduce, end_grads
// leaves the reduce-scatter running and adds a bucket's reduced chunk to its shard only after the next group's
// backward has been queued (finish_grad_sync adds the rest). On CPU ranks (MPI) each collective completes in its
// call: the same results, no overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/distributed/param_and_grad_buffer.h"

namespace megatron::distributed {

struct DataParallelConfig {
  bool overlap_grad_reduce = false;
  bool use_distributed_optimizer = false;
  int64_t bucket_size = 0;  // elements; 0 = Megatron's default (see above)
  // The backward already scaled every rank's gradients by 1 / |dp_group| (the trainer folds it into the loss
  // gradient, so a micro-batch's gradients are the same numbers at every data-parallel layout, which FP8's
  // quantisation of them needs): the reductions then sum (dense and expert buckets alike), and the results are
  // those described above.
  bool grads_prescaled = false;
  bool overlap_param_gather = false;  // FSDP on CUDA: prefetch the next module group (see above)
  bool fsdp = false;          // one bucket per unit (see above); needs use_distributed_optimizer
  bool shard_grads = false;   // FSDP optim_grads and optim_grads_params
  bool shard_params = false;  // FSDP optim_grads_params
};

// The bucket size Megatron would use.
int64_t resolve_bucket_size(const DataParallelConfig& config, int dp_size);

class DistributedDataParallel {
 public:
  // Rebinds the params' main_grads (and values, with the distributed optimizer) into buffers; the
  // communicators must outlive this object. dp_group: the dense gradients' group (DP x CP); expert_dp_group:
  // the expert parameters' (ParallelContext::expert_dp()); null refuses expert parameters.
  // units (FSDP): the parameter lists whose parameters share buckets; every parameter in at least one (the first
  // one it appears in places it).
  DistributedDataParallel(Context& ctx, const nn::ParameterList& params, comm::Communicator& dp_group,
                          const DataParallelConfig& config, comm::Communicator* expert_dp_group = nullptr,
                          const std::vector<nn::ParameterList>& units = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  void zero_grads(Context& ctx);
  void on_grads_final(Context& ctx, const nn::ParameterList& params);
  // Told once per bucket and iteration, right after the bucket's reduction is queued (during the backward with
  // --overlap-grad-reduce, else in finish_grad_sync): the bucket's gradients (with the distributed optimizer only
  // this rank's shard of them is meaningful) and the stream on which they are final once the work queued there so
  // far has run. Not told with FSDP's sharded gradients (each backward reduces its own).
  using BucketReduced = std::function<void(Context& ctx, const Tensor& grads, StreamHandle stream)>;
  void on_bucket_reduced(BucketReduced listener) { bucket_reduced_ = std::move(listener); }
  void finish_grad_sync(Context& ctx);

  // FSDP around each use of a unit (see above); no-ops for what persists whole.
  void acquire_params(Context& ctx, const nn::ParameterList& params);
  void prefetch_params(Context& ctx, const nn::ParameterList& params, bool forward);
  void release_params(Context& ctx, const nn::ParameterList& params, bool keep_values = false);
  void begin_grads(Context& ctx, const nn::ParameterList& params);
  void end_grads(Context& ctx, const nn::ParameterList& params);
  // Checkpoints with sharded values: every bucket acquired (a save or a load reads or writes the Parameters),
  // the loaded values written back to this rank's shards, and everything released again.
  void acquire_all_params(Context& ctx);
  void store_params(Context& ctx);
  void release_all_params(Context& ctx);
  // The elements of p's gradient this rank holds once reduced: main_grad, or with sharded gradients the part of
  // p inside this rank's shard (possibly empty).
  Tensor held_grad(const nn::Parameter* p) const;

  const DataParallelConfig& config() const { return config_; }
  int64_t bucket_size() const { return bucket_size_; }
  comm::Communicator& dp_group() const { return dp_; }
  // The group buffer b is reduced and sharded over: dp_group, or expert_dp_group for expert buffers.
  comm::Communicator& group(size_t buffer) const { return *groups_.at(buffer); }
  bool is_expert(size_t buffer) const { return expert_.at(buffer); }
  std::vector<ParamAndGradBuffer>& buffers() { return buffers_; }
  const std::vector<ParamAndGradBuffer>& buffers() const { return buffers_; }
  // Where a parameter lives: (buffer, bucket).
  std::pair<size_t, size_t> location(const nn::Parameter* p) const;
  // Every gradient buffer, whole (what the optimizer reads without the distributed optimizer).
  std::vector<Tensor> grad_buffers() const;

 private:
  void start_bucket(Context& ctx, size_t buffer, size_t bucket);
  void reset_counts();
  // The reduction of bucket k of buffer b (Avg, or Sum after scaling; see above), scaling `grads` if needed.
  comm::ReduceOp reduce_op(Context& ctx, size_t b, const Tensor& grads);
  // The (buffer, bucket) pairs holding `params`, each once.
  std::vector<std::pair<size_t, size_t>> buckets_of(const nn::ParameterList& params) const;
  // FSDP (fsdp.cpp): a sharded bucket's whole values gathered into in_use_[b][k].values (on CUDA, queued on the
  // communication stream); ctx's stream made to wait for it; the reduce-scatters left running, added to their
  // shards (all, or all but the newest); gathered buckets nobody uses dropped (before their shards change).
  void gather_bucket(Context& ctx, size_t b, size_t k);
  void wait_gathered(Context& ctx, size_t b, size_t k);
  void add_reductions(Context& ctx, bool keep_newest);
  void drop_prefetched(Context& ctx);
  void finish_fsdp_step(Context& ctx);  // every reduction added, prefetched buckets dropped (finish_grad_sync)
  // The stream FSDP's collectives run on (the communication stream on CUDA, ordered after ctx's stream's work so
  // far), and whether it is asynchronous to ctx's stream.
  StreamHandle fsdp_stream(Context& ctx);
  bool fsdp_async() const;

  comm::Communicator& dp_;
  comm::Communicator* expert_dp_;
  DataParallelConfig config_;
  int64_t bucket_size_ = 0;
  std::vector<ParamAndGradBuffer> buffers_;
  std::vector<comm::Communicator*> groups_;  // per buffer
  std::vector<bool> expert_;                 // per buffer
  struct Where {
    size_t buffer, bucket, index;  // index: into final_
  };
  std::unordered_map<const nn::Parameter*, Where> location_;
  std::vector<bool> final_;                  // per parameter: reported final this iteration
  std::vector<std::vector<int>> remaining_;  // per buffer, per bucket: parameters not final yet
  std::vector<std::vector<bool>> started_;
  struct InUse {  // FSDP: a bucket's whole tensors while in use (values also once prefetched), and their users
    Tensor values, grads;
    int value_users = 0, grad_users = 0;
    int gathered_event = -1;  // CUDA: the event marking values' all-gather on the communication stream
  };
  std::vector<std::vector<InUse>> in_use_;  // per buffer, per bucket
  BucketReduced bucket_reduced_;
  struct Streams;  // CUDA stream and events (CUDA builds)
  std::unique_ptr<Streams> streams_;
};

}  // namespace megatron::distributed
