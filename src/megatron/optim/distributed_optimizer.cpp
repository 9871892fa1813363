#include "megatron/optim/distributed_optimizer.h"

#include "megatron/optim/param_groups.h"

#include <algorithm>

#include "megatron/distributed/finalize_model_grads.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/fp8/fp8.h"

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

namespace {

// Where the weights kept in FP8 find their scaling: each one's index in `scalings`, every such weight of ddp
// covered once, and the recipe's constants shared.
std::unordered_map<const nn::Parameter*, size_t> index_fp8_scalings(const distributed::DistributedDataParallel& ddp,
                                                                    const std::vector<Fp8ParamScaling>& scalings) {
  std::unordered_map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < scalings.size(); ++i) {
    const Fp8ParamScaling& s = scalings[i];
    MEGATRON_CHECK(s.param != nullptr && s.param->keep_in_fp8, "DistributedOptimizer: FP8 scaling ", i,
                   " is not for a parameter kept in FP8");
    MEGATRON_CHECK(index.emplace(s.param, i).second, "DistributedOptimizer: two FP8 scalings for ", s.param->name);
    const Fp8ParamScaling& first = scalings.front();
    MEGATRON_CHECK(s.scale.defined() == first.scale.defined() && s.fp8_max == first.fp8_max &&
                       s.margin == first.margin && s.split_group == first.split_group,
                   "DistributedOptimizer: the FP8 scaling of ", s.param->name, " follows another recipe than ",
                   first.param->name, "'s");
  }
  for (const distributed::ParamAndGradBuffer& buffer : ddp.buffers())
    for (const nn::Parameter* p : buffer.params())
      MEGATRON_CHECK(!p->keep_in_fp8 || index.count(p), "DistributedOptimizer: ", p->name,
                     " is kept in FP8 but has no FP8 scaling to quantise its updates with");
  return index;
}

// Master weights for FP8-kept ones: fp32 for bf16/fp16 (and fp32) parameters, F64 for the CPU's F64 ones.
DType master_dtype(DType param) { return param == DType::F64 ? DType::F64 : DType::F32; }

// A flat range as [rows, cols] for the cast kernel, cols the largest of 128, 64, 32, 16 that divides it.
Shape cast_shape(int64_t n) {
  for (int64_t cols : {128, 64, 32, 16})
    if (n % cols == 0) return Shape{n / cols, cols};
  return Shape{1, n};
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(Context& ctx, distributed::DistributedDataParallel& ddp,
                                           const AdamWOptions& options, bool overlap_param_gather,
                                           std::vector<Fp8ParamScaling> fp8_params)
    : ddp_(ddp), fp8_params_(std::move(fp8_params)), overlap_(overlap_param_gather) {
  MEGATRON_CHECK(ddp.config().use_distributed_optimizer, "DistributedOptimizer: the DistributedDataParallel must be "
                                                         "built with use_distributed_optimizer (sharded buckets)");
  const auto fp8_index = index_fp8_scalings(ddp, fp8_params_);
  MEGATRON_CHECK(fp8_params_.empty() || options.offload_fraction == 0.0, "DistributedOptimizer: weights kept in FP8 "
                 "(--fp8-param-gather) cannot update in host memory (--optimizer-cpu-offload)");
  std::vector<AdamWParam> ranges;
  for (size_t b = 0; b < ddp.buffers().size(); ++b) {
    const distributed::ParamAndGradBuffer& buffer = ddp.buffers()[b];
    const int rank = ddp.group(b).rank();  // expert buffers: the expert-DP rank
    const distributed::BufferLayout& layout = buffer.layout();
    if (buffer.fp8_values()) {
      MEGATRON_CHECK(fp8_group_ == nullptr || fp8_group_ == &ddp.group(b), "DistributedOptimizer: weights kept in "
                     "FP8 in buffers of two data-parallel groups");
      fp8_group_ = &ddp.group(b);
    }
    for (size_t k = 0; k < layout.buckets.size(); ++k) {
      auto [s0, s1] = buffer.shard(k, rank);
      grad_shards_.push_back(buffer.grad_shard(k));
      for (size_t e : layout.buckets[k].entries) {
        const distributed::BufferLayout::Entry& entry = layout.entries[e];
        const int64_t lo = std::max(entry.offset, s0), hi = std::min(entry.offset + entry.numel, s1);
        if (lo >= hi) continue;
        const nn::Parameter* param = buffer.params()[entry.param];
        Tensor updated = buffer.values_range(lo, hi);
        if (buffer.fp8_values()) {
          // The master from the values before the move; AdamW updates it in place like an fp32 parameter.
          Tensor master = ctx.empty(Shape{hi - lo}, master_dtype(buffer.param_dtype()));
          const Tensor& initial = buffer.initial_value(entry.param);
          ops::cast(ctx, master, initial.view({initial.numel()}).slice(lo - entry.offset, hi - entry.offset));
          fp8_shards_.push_back({fp8_index.at(param), master, updated});
          updated = master;
        }
        ranges.push_back(AdamWParam{updated, buffer.grads_range(lo, hi), param->no_weight_decay,
                                    distributed::grad_changes_after_reduction(*param),
                                    is_embedding_or_output_parameter(param->name)});
        param_ranges_.push_back({param, lo - entry.offset, hi - entry.offset});
        param_grad_shards_.emplace_back(param, buffer.grads_range(lo, hi));
        shard_elements_ += hi - lo;
      }
    }
    pending_.emplace_back(layout.buckets.size(), false);
  }
  adamw_ = std::make_unique<AdamW>(ctx, std::move(ranges), options);
  for (distributed::ParamAndGradBuffer& buffer : ddp.buffers()) buffer.release_initial_values();
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
  requantize_fp8_params(ctx);  // the FP8 weights' first values, from the masters just taken
}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::step(Context& ctx, double lr, double weight_decay, float grad_scale, Timers* timers,
                                std::optional<double> decoupled_lr) {
  finish_param_gather(ctx);  // a previous gather must land before the shards are read again
  {
    TimerScope timer(timers, "optimizer-inner-step", 1);
    adamw_->step(ctx, lr, weight_decay, grad_scale, decoupled_lr);
    quantize_fp8_shards(ctx);
  }
  TimerScope timer(timers, "params-all-gather", 1);
  gather(ctx);
}

void DistributedOptimizer::requantize_fp8_params(Context& ctx) {
  if (fp8_params_.empty()) return;
  finish_param_gather(ctx);
  quantize_fp8_shards(ctx);
  gather(ctx, /*only_fp8=*/true);
}

void DistributedOptimizer::quantize_fp8_shards(Context& ctx) {
  if (fp8_params_.empty()) return;
  const Fp8ParamScaling& recipe = fp8_params_.front();
  const int64_t n = int64_t(fp8_params_.size());
  Tensor scales;  // per weight: the scale to cast with
  if (recipe.scale.defined()) {  // delayed: the state's scales, shared by every rank already
    for (const Fp8ParamScaling& w : fp8_params_) ops::copy(ctx, w.param->fp8_scale_inv, w.scale_inv);
  } else {  // current: each whole weight's amax, its shards' maximum over DP and over the TP split
    Tensor amax = ctx.empty(Shape{n}, DType::F32);
    ops::fill(ctx, amax, 0.0);
    for (const Fp8Shard& shard : fp8_shards_)
      ops::amax(ctx, amax.slice(int64_t(shard.scaling), int64_t(shard.scaling) + 1), shard.master);
    for (comm::Communicator* group : {fp8_group_, recipe.split_group})
      if (group != nullptr && group->size() > 1) group->all_reduce(amax, comm::ReduceOp::Max, ctx.stream());
    scales = ctx.empty(Shape{n}, DType::F32);
    Tensor scale_invs = ctx.empty(Shape{n}, DType::F32);
    ops::fp8_scale_from_amax(ctx, scales, scale_invs, amax, recipe.fp8_max, recipe.margin, /*keep_on_invalid=*/false);
    for (int64_t i = 0; i < n; ++i) ops::copy(ctx, fp8_params_[size_t(i)].param->fp8_scale_inv, scale_invs.slice(i, i + 1));
  }
  for (const Fp8Shard& shard : fp8_shards_) {
    const Fp8ParamScaling& w = fp8_params_[shard.scaling];
    const Shape shape = cast_shape(shard.master.numel());
    const Tensor scale = scales.defined() ? scales.slice(int64_t(shard.scaling), int64_t(shard.scaling) + 1) : w.scale;
    ops::fp8_cast_transpose(ctx, shard.values.view(shape.dims()), Tensor(), w.amax, shard.master.view(shape.dims()), scale);
  }
}

void DistributedOptimizer::gather(Context& ctx, bool only_fp8) {
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
    if (only_fp8 && !buffer.fp8_values()) continue;
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
