#include "megatron/optim/distributed_optimizer.h"

#include <algorithm>

#if MEGATRON_WITH_CUDA
#include "megatron/core/cuda_check.h"
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron::optim {

#if MEGATRON_WITH_CUDA
struct DistributedOptimizer::Streams {
  CudaStream gather;
  CudaEvent stepped;
  std::vector<std::vector<std::unique_ptr<CudaEvent>>> gathered;  // per buffer, per bucket
};
#else
struct DistributedOptimizer::Streams {};
#endif

DistributedOptimizer::DistributedOptimizer(Context& ctx, distributed::DistributedDataParallel& ddp,
                                           const AdamWOptions& options, bool overlap_param_gather)
    : ddp_(ddp), overlap_(overlap_param_gather) {
  MEGATRON_CHECK(ddp.config().use_distributed_optimizer, "DistributedOptimizer: the DistributedDataParallel must be "
                                                         "built with use_distributed_optimizer (sharded buckets)");
  std::vector<AdamWParam> ranges;
  for (size_t b = 0; b < ddp.buffers().size(); ++b) {
    const distributed::ParamAndGradBuffer& buffer = ddp.buffers()[b];
    const int rank = ddp.group(b).rank();  // expert buffers: the expert-DP rank
    const distributed::BufferLayout& layout = buffer.layout();
    for (size_t k = 0; k < layout.buckets.size(); ++k) {
      auto [s0, s1] = buffer.shard(k, rank);
      grad_shards_.push_back(buffer.grad_shard(k));
      for (size_t e : layout.buckets[k].entries) {
        const distributed::BufferLayout::Entry& entry = layout.entries[e];
        const int64_t lo = std::max(entry.offset, s0), hi = std::min(entry.offset + entry.numel, s1);
        if (lo >= hi) continue;
        ranges.push_back(AdamWParam{buffer.values_range(lo, hi), buffer.grads_range(lo, hi),
                                    buffer.params()[entry.param]->no_weight_decay});
        param_ranges_.push_back({buffer.params()[entry.param], lo - entry.offset, hi - entry.offset});
        param_grad_shards_.emplace_back(buffer.params()[entry.param], buffer.grads_range(lo, hi));
        shard_elements_ += hi - lo;
      }
    }
    pending_.emplace_back(layout.buckets.size(), false);
  }
  adamw_ = std::make_unique<AdamW>(ctx, std::move(ranges), options);
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda() && overlap_) {
    streams_ = std::make_unique<Streams>();
    for (const distributed::ParamAndGradBuffer& buffer : ddp.buffers()) {
      streams_->gathered.emplace_back();
      for (size_t k = 0; k < buffer.layout().buckets.size(); ++k)
        streams_->gathered.back().push_back(std::make_unique<CudaEvent>());
    }
  }
#endif
}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::step(Context& ctx, double lr, double weight_decay, float grad_scale) {
  finish_param_gather(ctx);  // a previous gather must land before the shards are read again
  adamw_->step(ctx, lr, weight_decay, grad_scale);
  gather(ctx);
}

void DistributedOptimizer::gather(Context& ctx) {
  StreamHandle stream = ctx.stream();
#if MEGATRON_WITH_CUDA
  if (streams_) {
    streams_->stepped.record(ctx.stream());
    streams_->gather.wait(streams_->stepped.get());
    stream = streams_->gather.get();
  }
#endif
  for (size_t b = 0; b < ddp_.buffers().size(); ++b) {
    const distributed::ParamAndGradBuffer& buffer = ddp_.buffers()[b];
    comm::Communicator& dp = ddp_.group(b);
    if (buffer.sharding().params) continue;  // FSDP gathers each bucket where it is used
    // Forward order: the embedding sits in the last bucket.
    for (size_t k = buffer.layout().buckets.size(); k-- > 0;) {
      dp.all_gather(buffer.bucket_values(k), buffer.value_shard(k), stream);
#if MEGATRON_WITH_CUDA
      if (streams_) {
        streams_->gathered[b][k]->record(stream);
        pending_[b][k] = true;
      }
#endif
    }
  }
}

void DistributedOptimizer::wait_for_params(Context& ctx, const nn::ParameterList& params) {
#if MEGATRON_WITH_CUDA
  if (!streams_) return;
  for (const nn::Parameter* p : params) {
    auto [b, k] = ddp_.location(p);
    if (!pending_[b][k]) continue;
    CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->gathered[b][k]->get(), 0));
    pending_[b][k] = false;
  }
#else
  (void)ctx;
  (void)params;
#endif
}

void DistributedOptimizer::finish_param_gather(Context& ctx) {
#if MEGATRON_WITH_CUDA
  if (!streams_) return;
  for (size_t b = 0; b < pending_.size(); ++b)
    for (size_t k = 0; k < pending_[b].size(); ++k)
      if (pending_[b][k]) {
        CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->gathered[b][k]->get(), 0));
        pending_[b][k] = false;
      }
#else
  (void)ctx;
#endif
}

}  // namespace megatron::optim
