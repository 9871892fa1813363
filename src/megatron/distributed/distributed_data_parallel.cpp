#include "megatron/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "megatron/ops/elementwise/elementwise.h"

#if MEGATRON_WITH_CUDA
#include "megatron/core/cuda_check.h"
#endif
#include "megatron/distributed/data_parallel_streams.h"

namespace megatron::distributed {

int64_t resolve_bucket_size(const DataParallelConfig& config, int dp_size) {
  if (!config.overlap_grad_reduce) return 0;
  if (config.bucket_size > 0) return config.bucket_size;
  return std::max<int64_t>(40'000'000, 1'000'000 * int64_t(dp_size));
}

DistributedDataParallel::DistributedDataParallel(Context& ctx, const nn::ParameterList& params,
                                                 comm::Communicator& dp_group, const DataParallelConfig& config,
                                                 comm::Communicator* expert_dp_group,
                                                 const std::vector<nn::ParameterList>& units)
    : dp_(dp_group), expert_dp_(expert_dp_group), config_(config),
      bucket_size_(config.fsdp ? 0 : resolve_bucket_size(config, dp_group.size())) {
  MEGATRON_CHECK(!config_.fsdp || config_.use_distributed_optimizer, "DistributedDataParallel: FSDP shards the "
                 "optimizer state (use_distributed_optimizer)");
  MEGATRON_CHECK(config_.fsdp || (!config_.shard_grads && !config_.shard_params), "DistributedDataParallel: sharded "
                 "gradients or parameters are FSDP's (DataParallelConfig::fsdp)");
  std::unordered_map<const nn::Parameter*, int> unit_of;
  for (size_t u = 0; u < units.size(); ++u)
    for (const nn::Parameter* p : units[u]) unit_of.emplace(p, int(u));
  const std::array<const comm::Communicator*, 2> groups = {&dp_, expert_dp_};
  for (const comm::Communicator* group : groups)
    MEGATRON_CHECK(group == nullptr || group->device() == ctx.device(), "DistributedDataParallel: the ",
                   group->describe(), " works on ", group->device(), " tensors but the model lives on ", ctx.device());
  // One buffer per (expert?, dtype, kept in FP8?): the dense ones first, each kind in order of first appearance.
  using Kind = std::tuple<bool, DType, bool>;
  std::map<Kind, std::vector<nn::Parameter*>> by_kind;
  std::vector<Kind> order;
  for (nn::Parameter* p : params) {
    MEGATRON_CHECK(!p->placement.expert || expert_dp_ != nullptr, "DistributedDataParallel: ", p->name,
                   " is an expert parameter; its gradient reduces over the expert-data-parallel group, which was not "
                   "given");
    MEGATRON_CHECK(!p->keep_in_fp8 || (config_.use_distributed_optimizer && !config_.shard_params),
                   "DistributedDataParallel: ", p->name, " is to be kept in FP8 (--fp8-param-gather), which needs the "
                   "distributed optimizer (--use-distributed-optimizer) and not FSDP's sharded parameters");
    const Kind kind{p->placement.expert, p->value.dtype(), p->keep_in_fp8};
    if (!by_kind.count(kind)) order.push_back(kind);
    by_kind[kind].push_back(p);
  }
  std::stable_partition(order.begin(), order.end(), [](const Kind& kind) { return !std::get<0>(kind); });
  buffers_.reserve(order.size());
  for (const Kind& kind : order) {
    const bool expert = std::get<0>(kind);
    comm::Communicator* group = expert ? expert_dp_ : &dp_;
    std::vector<int> unit_of_param;
    if (config_.fsdp)
      for (const nn::Parameter* p : by_kind[kind]) {
        auto it = unit_of.find(p);
        MEGATRON_CHECK(it != unit_of.end(), "DistributedDataParallel: FSDP needs every parameter in a unit; ", p->name,
                       " is in none");
        unit_of_param.push_back(it->second);
      }
    buffers_.emplace_back(ctx, by_kind[kind], bucket_size_, group->size(), config_.use_distributed_optimizer,
                          BufferSharding{.grads = config_.shard_grads, .params = config_.shard_params}, group->rank(),
                          unit_of_param);
    groups_.push_back(group);
    expert_.push_back(expert);
  }
  for (size_t b = 0; b < buffers_.size(); ++b) {
    for (const BufferLayout::Entry& e : buffers_[b].layout().entries)
      location_[buffers_[b].params()[e.param]] = Where{b, e.bucket, location_.size()};
    in_use_.emplace_back(buffers_[b].layout().buckets.size());
  }
  reset_counts();
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda() && (config_.overlap_grad_reduce || config_.shard_grads || config_.shard_params))
    streams_ = std::make_unique<Streams>();
#endif
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::reset_counts() {
  final_.assign(location_.size(), false);
  remaining_.assign(buffers_.size(), {});
  started_.assign(buffers_.size(), {});
  for (size_t b = 0; b < buffers_.size(); ++b) {
    for (const BufferLayout::Bucket& bucket : buffers_[b].layout().buckets)
      remaining_[b].push_back(int(bucket.entries.size()));
    started_[b].assign(remaining_[b].size(), false);
  }
}

std::pair<size_t, size_t> DistributedDataParallel::location(const nn::Parameter* p) const {
  auto it = location_.find(p);
  MEGATRON_CHECK(it != location_.end(), "DistributedDataParallel: parameter ", p->name, " is not in its buffers");
  return {it->second.buffer, it->second.bucket};
}

std::vector<Tensor> DistributedDataParallel::grad_buffers() const {
  std::vector<Tensor> out;
  for (const ParamAndGradBuffer& b : buffers_) out.push_back(b.grads());
  return out;
}

void DistributedDataParallel::zero_grads(Context& ctx) {
  for (ParamAndGradBuffer& b : buffers_) b.zero_grads(ctx);
  reset_counts();
}

void DistributedDataParallel::on_grads_final(Context& ctx, const nn::ParameterList& params) {
  if (config_.shard_grads) return;  // every backward reduced its buckets already (end_grads)
  for (const nn::Parameter* p : params) {
    auto it = location_.find(p);
    MEGATRON_CHECK(it != location_.end(), "DistributedDataParallel: parameter ", p->name, " is not in its buffers");
    const Where& w = it->second;
    MEGATRON_CHECK(!final_[w.index], "DistributedDataParallel: gradient of ", p->name,
                   " reported final twice in one iteration");
    final_[w.index] = true;
    if (--remaining_[w.buffer][w.bucket] == 0) start_bucket(ctx, w.buffer, w.bucket);
  }
}

void DistributedDataParallel::start_bucket(Context& ctx, size_t b, size_t k) {
  if (started_[b][k]) return;
  started_[b][k] = true;
  ParamAndGradBuffer& buffer = buffers_[b];
  comm::Communicator& group = *groups_[b];
  const Tensor grads = buffer.bucket_grads(k);
  const comm::ReduceOp op = reduce_op(ctx, b, grads);
  StreamHandle stream = ctx.stream();
#if MEGATRON_WITH_CUDA
  if (streams_ && config_.overlap_grad_reduce) {  // the communication stream picks up once backward wrote the bucket
    streams_->ready.record(ctx.stream());
    streams_->comm.wait(streams_->ready.get());
    streams_->used = true;
    stream = streams_->comm.get();
  }
#endif
  if (config_.use_distributed_optimizer) {
    auto [begin, end] = buffer.shard(k, group.rank());
    group.reduce_scatter(buffer.grads().slice(begin, end), grads, op, stream);
  } else {
    group.all_reduce(grads, op, stream);
  }
  if (bucket_reduced_) bucket_reduced_(ctx, grads, stream);
}

comm::ReduceOp DistributedDataParallel::reduce_op(Context& ctx, size_t b, const Tensor& grads) {
  // Expert buckets: sum over expert-DP of grads / |dp| (the header); Avg is that when the sizes agree.
  if (config_.grads_prescaled) return comm::ReduceOp::Sum;
  if (expert_[b] && groups_[b]->size() != dp_.size()) {
    ops::scale(ctx, grads, grads, 1.0 / double(dp_.size()));
    return comm::ReduceOp::Sum;
  }
  return comm::ReduceOp::Avg;
}

void DistributedDataParallel::finish_grad_sync(Context& ctx) {
  if (config_.shard_grads || config_.shard_params) finish_fsdp_step(ctx);
  for (size_t b = 0; b < buffers_.size(); ++b)
    for (size_t k = 0; k < started_[b].size() && !config_.shard_grads; ++k) start_bucket(ctx, b, k);
#if MEGATRON_WITH_CUDA
  if (streams_ && streams_->used) {
    streams_->done.record(streams_->comm.get());
    CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->done.get(), 0));
    streams_->used = false;
  }
#endif
  reset_counts();
}

}  // namespace megatron::distributed
