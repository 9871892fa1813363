// DistributedDataParallel's FSDP part (the header's "Megatron FSDP" section): whole buckets gathered from their
// shards around each use of a module group, gradients reduce-scattered into the shards after every backward,
// and on CUDA both on the communication stream, overlapped with the compute of the neighbouring group.
//
// Stream contract on CUDA (data_parallel_streams.h): a whole-bucket tensor is allocated on ctx's stream, so the
// communication stream first waits for ctx's work so far (the memory may have been used there); ctx's stream
// waits for a gather's event before the bucket's first use, and for a reduce-scatter's event before adding its
// result and freeing the tensor -- so every tensor is freed on ctx's stream after the last work that touched it.
#include <algorithm>

#include "megatron/distributed/data_parallel_streams.h"
#include "megatron/ops/elementwise/elementwise.h"

#if MEGATRON_WITH_CUDA
#include "megatron/core/cuda_check.h"
#endif

namespace megatron::distributed {

std::vector<std::pair<size_t, size_t>> DistributedDataParallel::buckets_of(const nn::ParameterList& params) const {
  std::vector<std::pair<size_t, size_t>> out;
  for (const nn::Parameter* p : params) {
    const std::pair<size_t, size_t> where = location(p);
    if (std::find(out.begin(), out.end(), where) == out.end()) out.push_back(where);
  }
  return out;
}

bool DistributedDataParallel::fsdp_async() const {
#if MEGATRON_WITH_CUDA
  return streams_ != nullptr && (config_.shard_grads || config_.shard_params);
#else
  return false;
#endif
}

StreamHandle DistributedDataParallel::fsdp_stream(Context& ctx) {
#if MEGATRON_WITH_CUDA
  if (fsdp_async()) {
    streams_->ready.record(ctx.stream());
    streams_->comm.wait(streams_->ready.get());
    return streams_->comm.get();
  }
#endif
  return ctx.stream();
}

void DistributedDataParallel::gather_bucket(Context& ctx, size_t b, size_t k) {
  ParamAndGradBuffer& buffer = buffers_[b];
  InUse& use = in_use_[b][k];
  use.values = ctx.empty(Shape{buffer.layout().buckets[k].numel}, buffer.param_dtype());
  const StreamHandle stream = fsdp_stream(ctx);
  groups_[b]->all_gather(use.values, buffer.value_shard(k), stream);
#if MEGATRON_WITH_CUDA
  if (fsdp_async()) {
    use.gathered_event = streams_->take_event();
    streams_->events[size_t(use.gathered_event)]->record(stream);
  }
#endif
}

void DistributedDataParallel::wait_gathered(Context& ctx, size_t b, size_t k) {
  InUse& use = in_use_[b][k];
  if (use.gathered_event < 0) return;
#if MEGATRON_WITH_CUDA
  CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->events[size_t(use.gathered_event)]->get(), 0));
  streams_->give_event(use.gathered_event);
#else
  (void)ctx;
#endif
  use.gathered_event = -1;
}

void DistributedDataParallel::acquire_params(Context& ctx, const nn::ParameterList& params) {
  for (auto [b, k] : buckets_of(params)) {
    InUse& use = in_use_[b][k];
    if (!buffers_[b].sharding().params || use.value_users++ > 0) continue;
    if (!use.values.defined()) gather_bucket(ctx, b, k);  // else prefetched
    wait_gathered(ctx, b, k);
    buffers_[b].bind_values(k, use.values);
  }
}

void DistributedDataParallel::prefetch_params(Context& ctx, const nn::ParameterList& params, bool forward) {
  if (!fsdp_async() || !config_.overlap_param_gather) return;
  // Buckets hold the parameters in reverse model order: the next group to run forward sits in the bucket before.
  for (auto [b, k] : buckets_of(params)) {
    const size_t next = forward ? k - 1 : k + 1;
    if (!buffers_[b].sharding().params || (forward && k == 0) || next >= in_use_[b].size()) continue;
    if (in_use_[b][next].value_users == 0 && !in_use_[b][next].values.defined()) gather_bucket(ctx, b, next);
  }
}

void DistributedDataParallel::release_params(Context&, const nn::ParameterList& params, bool keep_values) {
  for (auto [b, k] : buckets_of(params)) {
    ParamAndGradBuffer& buffer = buffers_[b];
    InUse& use = in_use_[b][k];
    if (!buffer.sharding().params) continue;
    MEGATRON_CHECK(use.value_users > 0, "DistributedDataParallel: bucket ", k, " of buffer ", b,
                   " released more often than acquired");
    if (--use.value_users > 0) continue;
    buffer.unbind_values(k);
    if (!keep_values) use.values = Tensor();  // back to the allocator, in ctx's stream order
  }
}

void DistributedDataParallel::drop_prefetched(Context& ctx) {
  for (size_t b = 0; b < in_use_.size(); ++b)
    for (size_t k = 0; k < in_use_[b].size(); ++k) {
      InUse& use = in_use_[b][k];
      if (use.value_users > 0 || !use.values.defined()) continue;
      wait_gathered(ctx, b, k);
      use.values = Tensor();
    }
}

void DistributedDataParallel::begin_grads(Context& ctx, const nn::ParameterList& params) {
  for (auto [b, k] : buckets_of(params)) {
    ParamAndGradBuffer& buffer = buffers_[b];
    InUse& use = in_use_[b][k];
    if (!buffer.sharding().grads || use.grad_users++ > 0) continue;
    use.grads = ctx.empty(Shape{buffer.layout().buckets[k].numel}, nn::main_grad_dtype(buffer.param_dtype()));
    ops::fill(ctx, use.grads, 0.0);
    buffer.bind_grads(k, use.grads);
  }
}

void DistributedDataParallel::end_grads(Context& ctx, const nn::ParameterList& params) {
  for (auto [b, k] : buckets_of(params)) {
    ParamAndGradBuffer& buffer = buffers_[b];
    InUse& use = in_use_[b][k];
    if (!buffer.sharding().grads) continue;
    MEGATRON_CHECK(use.grad_users > 0, "DistributedDataParallel: bucket ", k, " of buffer ", b,
                   " ended its gradients more often than it began them");
    if (--use.grad_users > 0) continue;
    // This micro-batch's gradients of the bucket, reduce-scattered in place (into this rank's chunk of the
    // whole bucket), then added to the shard where earlier micro-batches' already are.
    comm::Communicator& group = *groups_[b];
    const comm::ReduceOp op = reduce_op(ctx, b, use.grads);
    const int64_t n = use.grads.numel() / group.size();
    const Tensor chunk = use.grads.slice(group.rank() * n, (group.rank() + 1) * n);
    const StreamHandle stream = fsdp_stream(ctx);
    group.reduce_scatter(chunk, use.grads, op, stream);
    buffer.unbind_grads(k);
#if MEGATRON_WITH_CUDA
    if (fsdp_async() && config_.overlap_grad_reduce) {
      const int event = streams_->take_event();
      streams_->events[size_t(event)]->record(stream);
      streams_->reductions.push_back({b, k, std::move(use.grads), event});
      use.grads = Tensor();
      continue;
    }
    if (fsdp_async()) {  // not overlapped: ctx's stream waits for the reduce-scatter right away
      streams_->done.record(stream);
      CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->done.get(), 0));
    }
#endif
    const Tensor shard = buffer.grad_shard(k);
    ops::add(ctx, shard, shard, chunk);
    use.grads = Tensor();
  }
  add_reductions(ctx, /*keep_newest=*/true);
}

void DistributedDataParallel::add_reductions(Context& ctx, bool keep_newest) {
#if MEGATRON_WITH_CUDA
  if (!streams_) return;
  std::vector<Streams::Reduction>& pending = streams_->reductions;
  const size_t ready = keep_newest && !pending.empty() ? pending.size() - 1 : pending.size();
  for (size_t i = 0; i < ready; ++i) {
    Streams::Reduction& r = pending[i];
    CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->events[size_t(r.event)]->get(), 0));
    streams_->give_event(r.event);
    comm::Communicator& group = *groups_[r.buffer];
    const int64_t n = r.grads.numel() / group.size();
    const Tensor shard = buffers_[r.buffer].grad_shard(r.bucket);
    ops::add(ctx, shard, shard, r.grads.slice(group.rank() * n, (group.rank() + 1) * n));
  }
  pending.erase(pending.begin(), pending.begin() + std::ptrdiff_t(ready));
#else
  (void)ctx;
  (void)keep_newest;
#endif
}

void DistributedDataParallel::finish_fsdp_step(Context& ctx) {
  add_reductions(ctx, /*keep_newest=*/false);
  drop_prefetched(ctx);  // the optimizer changes the shards next
}

void DistributedDataParallel::acquire_all_params(Context& ctx) {
  for (const ParamAndGradBuffer& buffer : buffers_) acquire_params(ctx, buffer.params());
}

void DistributedDataParallel::store_params(Context& ctx) {
  for (size_t b = 0; b < buffers_.size(); ++b) {
    ParamAndGradBuffer& buffer = buffers_[b];
    if (!buffer.sharding().params) continue;
    for (size_t k = 0; k < buffer.layout().buckets.size(); ++k) {
      const InUse& use = in_use_[b][k];
      MEGATRON_CHECK(use.value_users > 0, "DistributedDataParallel::store_params: bucket ", k, " of buffer ", b,
                     " is not acquired (acquire_all_params first)");
      auto [s0, s1] = buffer.shard(k, groups_[b]->rank());
      const int64_t base = buffer.layout().buckets[k].offset;
      ops::copy(ctx, buffer.value_shard(k), use.values.slice(s0 - base, s1 - base));
    }
  }
}

void DistributedDataParallel::release_all_params(Context& ctx) {
  for (const ParamAndGradBuffer& buffer : buffers_) release_params(ctx, buffer.params());
}

Tensor DistributedDataParallel::held_grad(const nn::Parameter* p) const {
  if (!config_.shard_grads) return p->main_grad;
  auto it = location_.find(p);
  MEGATRON_CHECK(it != location_.end(), "DistributedDataParallel: parameter ", p->name, " is not in its buffers");
  const ParamAndGradBuffer& buffer = buffers_[it->second.buffer];
  const size_t k = it->second.bucket;
  for (const size_t i : buffer.layout().buckets[k].entries) {
    const BufferLayout::Entry& e = buffer.layout().entries[i];
    if (buffer.params()[e.param] != p) continue;
    auto [s0, s1] = buffer.shard(k, groups_[it->second.buffer]->rank());
    const int64_t lo = std::max(e.offset, s0), hi = std::min(e.offset + e.numel, s1);
    return lo < hi ? buffer.grads_range(lo, hi) : buffer.grads_range(s0, s0);
  }
  MEGATRON_FAIL("DistributedDataParallel: ", p->name, " is not in its bucket");
}

}  // namespace megatron::distributed
