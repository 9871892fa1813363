#include "megatron/distributed/param_and_grad_buffer.h"

#include <algorithm>
#include <numeric>

#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::distributed {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

BufferLayout plan_buffer_layout(const std::vector<int64_t>& numels, int64_t bucket_size, int shard_for_dp,
                                const std::vector<bool>& own_bucket, const std::vector<int>& unit_of_param) {
  MEGATRON_CHECK(unit_of_param.empty() || unit_of_param.size() == numels.size(), "plan_buffer_layout: ",
                 unit_of_param.size(), " unit numbers for ", numels.size(), " parameters");
  MEGATRON_CHECK(bucket_size >= 0 && shard_for_dp >= 1, "plan_buffer_layout: bucket size ", bucket_size,
                 " and DP ", shard_for_dp, " must be >= 0 and >= 1");
  const bool sharded = shard_for_dp > 1;
  const int64_t bucket_multiple = std::lcm(int64_t(shard_for_dp), int64_t(128));
  BufferLayout layout;
  int64_t cursor = 0, bucket_start = 0;
  std::vector<size_t> open;  // entries of the bucket being filled
  int open_unit = -1;
  auto close_bucket = [&] {
    BufferLayout::Bucket b;
    b.offset = bucket_start;
    b.numel = (sharded ? round_up(cursor, bucket_multiple) : cursor) - bucket_start;
    b.entries = open;
    for (size_t e : open) layout.entries[e].bucket = layout.buckets.size();
    layout.buckets.push_back(std::move(b));
    cursor = bucket_start = layout.buckets.back().offset + layout.buckets.back().numel;
    open.clear();
  };
  for (size_t i = numels.size(); i-- > 0;) {
    MEGATRON_CHECK(numels[i] >= 0, "plan_buffer_layout: parameter ", i, " has ", numels[i], " elements");
    const bool alone = sharded && i < own_bucket.size() && own_bucket[i];
    const int unit = unit_of_param.empty() ? -1 : unit_of_param[i];
    if ((alone || unit != open_unit) && !open.empty()) close_bucket();
    open_unit = unit;
    if (sharded) cursor = round_up(cursor, 64);
    layout.entries.push_back(BufferLayout::Entry{i, cursor, numels[i], 0});
    open.push_back(layout.entries.size() - 1);
    cursor += numels[i];
    if (alone || (bucket_size > 0 && cursor - bucket_start >= bucket_size)) close_bucket();
  }
  if (!open.empty() || layout.buckets.empty()) close_bucket();
  layout.numel = cursor;
  return layout;
}

ParamAndGradBuffer::ParamAndGradBuffer(Context& ctx, std::vector<nn::Parameter*> params, int64_t bucket_size,
                                       int dp_size, bool distributed_optimizer, BufferSharding sharding, int rank,
                                       const std::vector<int>& unit_of_param)
    : params_(std::move(params)), dp_size_(dp_size), rank_(rank), sharding_(sharding) {
  MEGATRON_CHECK(!params_.empty(), "ParamAndGradBuffer: no parameters");
  MEGATRON_CHECK(distributed_optimizer || (!sharding.grads && !sharding.params), "ParamAndGradBuffer: sharded "
                 "storage needs the distributed optimizer's sharded buckets");
  MEGATRON_CHECK(rank >= 0 && rank < dp_size, "ParamAndGradBuffer: rank ", rank, " of ", dp_size);
  param_dtype_ = params_.front()->value.dtype();
  fp8_values_ = params_.front()->keep_in_fp8;
  MEGATRON_CHECK(!fp8_values_ || (distributed_optimizer && !sharding.params), "ParamAndGradBuffer: ",
                 params_.front()->name, " is kept in FP8 (--fp8-param-gather), which needs the distributed "
                 "optimizer's buffers with whole values (not FSDP's sharded parameters)");
  std::vector<int64_t> numels;
  std::vector<bool> own_bucket;
  for (const nn::Parameter* p : params_) {
    MEGATRON_CHECK(p->value.dtype() == param_dtype_, "ParamAndGradBuffer: parameter ", p->name, " is ",
                   p->value.describe(), " but the buffer holds ", dtype_name(param_dtype_), " parameters");
    MEGATRON_CHECK(p->keep_in_fp8 == fp8_values_, "ParamAndGradBuffer: parameter ", p->name,
                   p->keep_in_fp8 ? " is" : " is not", " kept in FP8 but ", params_.front()->name,
                   fp8_values_ ? " is" : " is not", "; one buffer holds one kind");
    MEGATRON_CHECK(p->main_grad.defined() && p->main_grad.numel() == p->value.numel(), "ParamAndGradBuffer: ",
                   p->name, " needs a main_grad of its size");
    numels.push_back(p->value.numel());
    own_bucket.push_back(p->placement.shared_embedding);
    dims_.push_back(p->value.shape().dims());
  }
  layout_ = plan_buffer_layout(numels, bucket_size, distributed_optimizer ? dp_size : 1, own_bucket, unit_of_param);
  const DType grad_dtype = nn::main_grad_dtype(param_dtype_);
  const int64_t grad_elements = sharding_.grads ? layout_.numel / dp_size_ : layout_.numel;
  grads_ = ctx.empty(Shape{grad_elements}, grad_dtype);
  ops::fill(ctx, grads_, 0.0);
  if (distributed_optimizer) {
    values_ = ctx.empty(Shape{sharding_.params ? layout_.numel / dp_size_ : layout_.numel},
                        fp8_values_ ? DType::F8E4M3 : param_dtype_);
    ops::fill(ctx, values_, 0.0);  // padding (FP8 storage: everything, until the optimizer quantises into it)
  }
  if (fp8_values_) initial_values_.resize(params_.size());
  for (const BufferLayout::Entry& e : layout_.entries) {
    nn::Parameter& p = *params_[e.param];
    // Moves the parameter's tensor into `storage`: all of it into its slice of the whole buffer, or with
    // sharded storage only the elements inside this rank's shard of its bucket (possibly none), the parameter
    // then left unbound until its bucket is in use (bind_values / bind_grads).
    auto move_in = [&](Tensor& tensor, bool sharded, const Tensor& storage) {
      const Tensor flat = tensor.view({e.numel});
      if (!sharded) {
        Tensor slice = storage.slice(e.offset, e.offset + e.numel);
        ops::copy(ctx, slice, flat);
        tensor = slice.view(dims_[e.param]);
        return;
      }
      auto [s0, s1] = shard(e.bucket, rank_);
      const int64_t lo = std::max(e.offset, s0), hi = std::min(e.offset + e.numel, s1);
      if (lo < hi) ops::copy(ctx, storage_range(storage, true, lo, hi, "moved"), flat.slice(lo - e.offset, hi - e.offset));
      tensor = Tensor();
    };
    move_in(p.main_grad, sharding_.grads, grads_);
    if (fp8_values_) {  // the values stay behind for the optimizer's masters; the FP8 view starts at zero
      initial_values_[e.param] = p.value;
      p.value = values_.slice(e.offset, e.offset + e.numel).view(dims_[e.param]);
      p.fp8_stands_for = param_dtype_;
      p.fp8_scale_inv = ctx.empty(Shape{1}, DType::F32);
      ops::fill(ctx, p.fp8_scale_inv, 1.0);
    } else if (distributed_optimizer) {
      move_in(p.value, sharding_.params, values_);
    }
  }
  ctx.synchronize();           // the old tensors are released now...
  ctx.allocator().empty_cache();  // ...and their cached blocks go back to the device for the optimizer
}

const Tensor& ParamAndGradBuffer::grads() const {
  MEGATRON_CHECK(!sharding_.grads, "ParamAndGradBuffer::grads: only this rank's gradient shards persist (sharded "
                                   "storage); use grads_range / grad_shard");
  return grads_;
}

const Tensor& ParamAndGradBuffer::values() const {
  MEGATRON_CHECK(!sharding_.params, "ParamAndGradBuffer::values: only this rank's value shards persist (sharded "
                                    "storage); use values_range / value_shard");
  return values_;
}

Tensor ParamAndGradBuffer::bucket_grads(size_t b) const {
  const BufferLayout::Bucket& bucket = layout_.buckets.at(b);
  return grads().slice(bucket.offset, bucket.offset + bucket.numel);
}

Tensor ParamAndGradBuffer::bucket_values(size_t b) const {
  MEGATRON_CHECK(values_.defined(), "ParamAndGradBuffer::bucket_values: the values live in the buffer only with the "
                                    "distributed optimizer");
  const BufferLayout::Bucket& bucket = layout_.buckets.at(b);
  return values().slice(bucket.offset, bucket.offset + bucket.numel);
}

std::pair<int64_t, int64_t> ParamAndGradBuffer::shard(size_t b, int rank) const {
  const BufferLayout::Bucket& bucket = layout_.buckets.at(b);
  MEGATRON_CHECK(bucket.numel % dp_size_ == 0, "ParamAndGradBuffer::shard: bucket ", b, " of ", bucket.numel,
                 " elements does not split into ", dp_size_, " shards");
  const int64_t n = bucket.numel / dp_size_;
  return {bucket.offset + rank * n, bucket.offset + (rank + 1) * n};
}

Tensor ParamAndGradBuffer::storage_range(const Tensor& storage, bool sharded, int64_t lo, int64_t hi,
                                         const char* what) const {
  MEGATRON_CHECK(storage.defined(), "ParamAndGradBuffer: no ", what, " storage (the values live in the buffer only "
                                    "with the distributed optimizer)");
  MEGATRON_CHECK(0 <= lo && lo <= hi && hi <= layout_.numel, "ParamAndGradBuffer: ", what, " range [", lo, ", ", hi,
                 ") outside the buffer's ", layout_.numel, " elements");
  if (!sharded) return storage.slice(lo, hi);
  if (lo == hi) return storage.slice(0, 0);
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    auto [s0, s1] = shard(b, rank_);
    if (lo < s0 || hi > s1) continue;
    const int64_t base = layout_.buckets[b].offset / dp_size_;  // the shards of the earlier buckets come first
    return storage.slice(base + (lo - s0), base + (hi - s0));
  }
  MEGATRON_FAIL("ParamAndGradBuffer: ", what, " range [", lo, ", ", hi, ") is not inside rank ", rank_,
                "'s shard of one bucket: only that persists (sharded storage)");
}

Tensor ParamAndGradBuffer::grads_range(int64_t lo, int64_t hi) const {
  return storage_range(grads_, sharding_.grads, lo, hi, "gradient");
}

Tensor ParamAndGradBuffer::values_range(int64_t lo, int64_t hi) const {
  return storage_range(values_, sharding_.params, lo, hi, "value");
}

Tensor ParamAndGradBuffer::grad_shard(size_t b) const {
  auto [s0, s1] = shard(b, rank_);
  return grads_range(s0, s1);
}

Tensor ParamAndGradBuffer::value_shard(size_t b) const {
  auto [s0, s1] = shard(b, rank_);
  return values_range(s0, s1);
}

namespace {

// Rebinds (or with an undefined `whole`, unbinds) one tensor field of every Parameter of bucket b.
void bind_bucket(const BufferLayout& layout, size_t b, const std::vector<nn::Parameter*>& params,
                 const std::vector<std::vector<int64_t>>& dims, const Tensor& whole, Tensor nn::Parameter::*field) {
  const BufferLayout::Bucket& bucket = layout.buckets.at(b);
  MEGATRON_CHECK(!whole.defined() || whole.numel() == bucket.numel, "ParamAndGradBuffer: bucket ", b, " holds ",
                 bucket.numel, " elements; got ", whole.describe());
  for (size_t i : bucket.entries) {
    const BufferLayout::Entry& e = layout.entries[i];
    nn::Parameter& p = *params[e.param];
    p.*field = whole.defined() ? whole.slice(e.offset - bucket.offset, e.offset - bucket.offset + e.numel)
                                     .view(dims[e.param])
                               : Tensor();
  }
}

}  // namespace

void ParamAndGradBuffer::bind_values(size_t b, const Tensor& whole) {
  MEGATRON_CHECK(sharding_.params && whole.defined(), "ParamAndGradBuffer::bind_values: only with sharded values");
  bind_bucket(layout_, b, params_, dims_, whole, &nn::Parameter::value);
}

void ParamAndGradBuffer::unbind_values(size_t b) { bind_bucket(layout_, b, params_, dims_, Tensor(), &nn::Parameter::value); }

void ParamAndGradBuffer::bind_grads(size_t b, const Tensor& whole) {
  MEGATRON_CHECK(sharding_.grads && whole.defined(), "ParamAndGradBuffer::bind_grads: only with sharded gradients");
  bind_bucket(layout_, b, params_, dims_, whole, &nn::Parameter::main_grad);
}

void ParamAndGradBuffer::unbind_grads(size_t b) {
  bind_bucket(layout_, b, params_, dims_, Tensor(), &nn::Parameter::main_grad);
}

void ParamAndGradBuffer::zero_grads(Context& ctx) { ops::fill(ctx, grads_, 0.0); }

const Tensor& ParamAndGradBuffer::initial_value(size_t param) const {
  MEGATRON_CHECK(fp8_values_ && param < initial_values_.size() && initial_values_[param].defined(),
                 "ParamAndGradBuffer::initial_value: parameter ", param, " has no value kept from before the move "
                 "(only FP8 storage keeps them, until release_initial_values)");
  return initial_values_[param];
}

void ParamAndGradBuffer::release_initial_values() {
  for (Tensor& t : initial_values_) t = Tensor();
}

}  // namespace megatron::distributed
