#include "megatron/trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "megatron/distributed/finalize_model_grads.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/optimizer/optimizer.h"
#include "megatron/trainer/finite_check.h"

namespace megatron::trainer {
namespace {

std::vector<optim::AdamWParam> adamw_params(const nn::ParameterList& params) {
  std::vector<optim::AdamWParam> out;
  for (nn::Parameter* p : params)
    out.push_back({p->value, p->main_grad, p->no_weight_decay, distributed::grad_changes_after_reduction(*p),
                   optim::is_embedding_or_output_parameter(p->name)});
  return out;
}

// A parameter's values as the model computes with them: a weight kept in FP8 dequantised into F32 (value times
// its fp8_scale_inv, read back to the host: statistics only).
Tensor dequantized(Context& ctx, const nn::Parameter& p) {
  if (!p.stored_in_fp8()) return p.value;
  float scale_inv = 1.0f;
  copy_tensor(ctx, Tensor::from_blob(&scale_inv, {1}, DType::F32, Device::cpu()), p.fp8_scale_inv);
  Tensor out = ctx.empty(p.value.shape(), DType::F32);
  ops::cast(ctx, out, p.value);
  ops::scale(ctx, out, out, double(scale_inv));
  return out;
}

}  // namespace

Trainer::Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model)
    : ctx_(ctx),
      args_(args),
      chunks_{&model},
      own_parallel_(std::make_unique<parallel::ParallelContext>(parallel::ParallelContext::single(ctx.device()))),
      parallel_(own_parallel_.get()),
      scheduler_(optim::schedule_from_arguments(args.training)),
      batch_schedule_(train::BatchSizeSchedule::from_arguments(args)),
      scaler_(optim::make_loss_scaler(args.training)) {
  setup();
}

Trainer::Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model,
                 const parallel::ParallelContext& parallel)
    : Trainer(ctx, args, std::vector<nn::GPTModel*>{&model}, parallel) {}

Trainer::Trainer(Context& ctx, const train::Arguments& args, std::vector<nn::GPTModel*> chunks,
                 const parallel::ParallelContext& parallel)
    : ctx_(ctx),
      args_(args),
      chunks_(std::move(chunks)),
      parallel_(&parallel),
      scheduler_(optim::schedule_from_arguments(args.training)),
      batch_schedule_(train::BatchSizeSchedule::from_arguments(args)),
      scaler_(optim::make_loss_scaler(args.training)) {
  setup();
}

Trainer::~Trainer() = default;

void Trainer::setup() {
  const auto& t = args_.training;
  const auto& p = args_.parallel;
  const int dp = parallel_->dp_size();
  MEGATRON_CHECK(!chunks_.empty() && int(chunks_.size()) == p.virtual_pipeline_size, "Trainer: ", chunks_.size(),
                 " model chunks for ", p.virtual_pipeline_size, " virtual pipeline stages per rank");
  for (const nn::GPTModel* chunk : chunks_) {
    MEGATRON_CHECK(chunk->tensor_parallel().size() == parallel_->tp_size(), "Trainer: the model is split over ",
                   chunk->tensor_parallel().size(), " tensor-parallel ranks but the parallel context has TP ",
                   parallel_->tp_size(), " (build the GPTModel with the context's TP group)");
    MEGATRON_CHECK(chunk->context_parallel().size() == parallel_->cp_size(), "Trainer: the model splits sequences over ",
                   chunk->context_parallel().size(), " context-parallel ranks but the parallel context has CP ",
                   parallel_->cp_size(), " (build the GPTModel with the context's CP group)");
  }
  MEGATRON_CHECK(parallel_->pp_size() == p.pipeline_model_parallel_size, "Trainer: the arguments give a pipeline ",
                 "size of ", p.pipeline_model_parallel_size, " but the parallel context has PP ", parallel_->pp_size());
  if (parallel_->pp_size() > 1)
    p2p_ = std::make_unique<pipeline::PipelineComm>(
        pipeline::PipelineComm::create(*parallel_->pp().comm, !p.no_overlap_p2p_communication));
  MEGATRON_CHECK(args_.data_parallel_size() == dp, "Trainer: the arguments give a data-parallel size of ",
                 args_.data_parallel_size(), " (world size ", p.world_size, ") but the parallel context has DP ", dp);
  num_micro_batches_ = int(batch_schedule_.global_batch_size(0) / (int64_t(t.micro_batch_size) * dp));

  // The gradient buffers first: they rebind the parameters the optimizer then refers to.
  // Megatron FSDP (no_shard is plain DDP): a bucket per module group, sharded by the strategy.
  const bool fsdp = p.use_megatron_fsdp && p.data_parallel_sharding_strategy != "no_shard";
  distributed::DataParallelConfig ddp_config{.overlap_grad_reduce = p.overlap_grad_reduce,
                                          .use_distributed_optimizer = p.use_distributed_optimizer,
                                          .bucket_size = p.ddp_bucket_size,
                                          .grads_prescaled = true,
                                          .overlap_param_gather = p.overlap_param_gather,
                                          .fsdp = fsdp,
                                          .shard_grads = args_.fsdp_shards_grads(),
                                          .shard_params = args_.fsdp_shards_params()};
  mark_fp8_params();  // before the buffers: they give the weights kept in FP8 their storage
  std::vector<nn::ParameterList> units;
  if (fsdp)
    for (nn::GPTModel* chunk : chunks_)
      for (nn::ParameterList& group : chunk->parameter_groups()) units.push_back(std::move(group));
  ddp_ = std::make_unique<distributed::DistributedDataParallel>(ctx_, parameters(), *parallel_->dp_cp().comm, ddp_config,
                                                                parallel_->expert_dp().comm.get(), units);
  {  // every rank must join the expert norm reductions when any rank (pipeline stage) holds experts
    const nn::ParameterList params = parameters();
    double any[1] = {std::any_of(params.begin(), params.end(), [](auto* q) { return q->placement.expert; }) ? 1.0 : 0.0};
    parallel_->world().comm->all_reduce_host(any, comm::ReduceOp::Max);
    model_has_experts_ = any[0] != 0.0;
  }
  const optim::AdamWOptions adam{t.adam_beta1, t.adam_beta2, t.adam_eps,
                                 t.optimizer_cpu_offload ? t.optimizer_offload_fraction : 0.0,
                                 t.optimizer_cpu_offload && t.overlap_cpu_optimizer_d2h_h2d};
  ctx_.synchronize();
  const size_t allocated_before = ctx_.allocator().stats().allocated_bytes;
  if (p.use_distributed_optimizer)
    dist_optimizer_ =
        std::make_unique<optim::DistributedOptimizer>(ctx_, *ddp_, adam, p.overlap_param_gather, fp8_param_scalings());
  else
    optimizer_ = std::make_unique<optim::AdamW>(ctx_, adamw_params(parameters()), adam);
  ctx_.synchronize();
  const size_t allocated_after = ctx_.allocator().stats().allocated_bytes;
  optimizer_allocated_bytes_ = allocated_after > allocated_before ? allocated_after - allocated_before : 0;

  const int64_t s = local_seq(), b = t.micro_batch_size;
  loss_mask_ = ctx_.empty(Shape{b, s}, DType::F32);
  ops::fill(ctx_, loss_mask_, 1.0);
  const bool sft = args_.data.sft;  // packed conversations: documents and a loss mask in every micro-batch
  document_flags_ = {.reset_position_ids = args_.data.reset_position_ids || sft,
                     .reset_attention_mask = args_.data.reset_attention_mask || sft,
                     .eod_mask_loss = args_.data.eod_mask_loss};
  per_token_loss_ = t.calculate_per_token_loss;
  token_weighted_ = per_token_loss_ || document_flags_.eod_mask_loss || sft;
  prefetch_offloaded_gradients();
  build_hybrid_cp_models();
}

void Trainer::mark_fp8_params() {
  if (!args_.fp8.fp8_param_gather) return;
  MEGATRON_CHECK(args_.parallel.use_distributed_optimizer, "--fp8-param-gather needs --use-distributed-optimizer: "
                 "the distributed optimizer is what quantises the FP8 weights and gathers them");
  for (nn::GPTModel* chunk : chunks_)
    for (const auto& [linear, weight] : fp8_weights(*chunk)) weight->keep_in_fp8 = true;
}

std::vector<std::pair<int, nn::Parameter*>> Trainer::fp8_weights(nn::GPTModel& chunk) {
  std::vector<std::pair<int, nn::Parameter*>> out;
  const std::shared_ptr<nn::Fp8ScalingState>& state = chunk.fp8_state();
  if (!state) return out;
  std::unordered_map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : chunk.parameters()) by_name.emplace(p->name, p);
  for (int i = 0; i < state->size(); ++i) {
    auto it = by_name.find(state->name(i) + ".weight");
    MEGATRON_CHECK(it != by_name.end(), "Trainer: the FP8 linear ", state->name(i), " has no weight parameter ",
                   state->name(i), ".weight");
    out.emplace_back(i, it->second);
  }
  return out;
}

std::vector<optim::Fp8ParamScaling> Trainer::fp8_param_scalings() {
  std::vector<optim::Fp8ParamScaling> out;
  if (!args_.fp8.fp8_param_gather) return out;
  for (nn::GPTModel* chunk : chunks_) {
    for (const auto& [linear, weight] : fp8_weights(*chunk)) {
      const nn::Fp8ScalingState& state = *chunk->fp8_state();
      optim::Fp8ParamScaling s{.param = weight,
                               .split_group = parallel_->tp().comm.get(),
                               .fp8_max = nn::fp8_max(state.recipe().forward_dtype()),
                               .margin = float(state.recipe().margin)};
      if (state.recipe().scaling == nn::Fp8Scaling::Delayed) {
        const nn::Fp8TensorScaling slot = state.weight(linear);
        s.scale = slot.scale;
        s.scale_inv = slot.scale_inv;
        s.amax = slot.amax;
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

nn::ParameterList Trainer::parameters() const {
  nn::ParameterList all;
  for (nn::GPTModel* chunk : chunks_)
    for (nn::Parameter* p : chunk->parameters()) all.push_back(p);
  return all;
}

bool Trainer::holds_data_stage() const {
  for (const nn::GPTModel* chunk : chunks_)
    if (chunk->layout().pre_process || chunk->layout().post_process) return true;
  return false;
}

void Trainer::prefetch_offloaded_gradients() {
  // --overlap-cpu-optimizer-d2h-h2d: a reduced bucket's offloaded gradients start their copy to the host during
  // the backward -- unless something still rescales every gradient after the reductions (fp16's in-place
  // unscaling, the per-token loss's division); step() then copies them, still overlapped with the host update.
  if (adamw().options().overlap_offload_transfers && !scaler_ && !per_token_loss_)
    ddp_->on_bucket_reduced([this](Context& ctx, const Tensor& grads, StreamHandle stream) {
      adamw().prefetch_gradients(ctx, grads, stream);
    });
}

optim::AdamW& Trainer::adamw() { return dist_optimizer_ ? dist_optimizer_->adamw() : *optimizer_; }

size_t Trainer::optimizer_state_bytes() const {
  return dist_optimizer_ ? dist_optimizer_->state_bytes() : optimizer_->state_bytes();
}

size_t Trainer::optimizer_host_state_bytes() const {
  return dist_optimizer_ ? dist_optimizer_->adamw().host_state_bytes() : optimizer_->host_state_bytes();
}

int64_t Trainer::local_seq() const { return args_.model.seq_length / parallel_->cp_size(); }

HostMicroBatch Trainer::prepare_micro_batch(SampleStream& data) {
  return host_micro_batch(next_micro_batch(data), data, parallel_->cp_size(), parallel_->cp().rank());
}

HostMicroBatch Trainer::host_micro_batch(const Tensor& samples, const SampleStream& data, int cp_size, int cp_rank) {
  // Context parallelism: this rank's chunks of each sequence (Megatron's get_batch_on_this_cp_rank).
  const bool packed = data.layout() == SampleLayout::PackedConversations;
  const parallel::SequenceSplit split{cp_size, cp_rank, packed ? samples.dim(1) / 2 - 1 : samples.dim(1) - 1};
  if (packed) return make_packed_host_micro_batch(samples, split, host_);
  return make_host_micro_batch(samples, data.eod(), document_flags_, split, host_);
}

nn::StageInput Trainer::upload(const HostMicroBatch& mb) {
  nn::StageInput in{.tokens = ctx_.empty(mb.tokens.shape(), DType::I64), .labels = ctx_.empty(mb.labels.shape(), DType::I64),
                    .loss_mask = loss_mask_, .cu_seqlens = mb.cu_seqlens};
  std::vector<UploadStaging::Transfer> transfers{{in.tokens, mb.tokens}, {in.labels, mb.labels}};
  // Some tokens do not count, or the rows are split over fewer CP ranks (hybrid CP): this micro-batch's own mask.
  if (mb.loss_tokens != double(mb.loss_mask.numel()) || mb.loss_mask.shape() != loss_mask_.shape()) {
    in.loss_mask = ctx_.empty(mb.loss_mask.shape(), DType::F32);
    transfers.push_back({in.loss_mask, mb.loss_mask});
  }
  if (mb.position_ids.defined()) {
    in.position_ids = ctx_.empty(mb.position_ids.shape(), DType::I64);
    transfers.push_back({in.position_ids, mb.position_ids});
  }
  upload_staging_.upload(transfers);
  return in;
}

Tensor Trainer::next_micro_batch(SampleStream& data) {
  // Megatron's MegatronPretrainingSampler: each step takes mbs * DP consecutive samples; DP rank r reads
  // rows [r * mbs, (r + 1) * mbs) of them.
  const int64_t mbs = args_.training.micro_batch_size;
  return data.next(mbs * parallel_->dp_size(), host_, parallel_->dp().rank() * mbs, mbs);
}

std::vector<Tensor> Trainer::local_grads() const {
  return dist_optimizer_ ? dist_optimizer_->grad_shards() : ddp_->grad_buffers();
}

std::vector<Tensor> Trainer::norm_grads(bool expert) const {
  const nn::ParameterList params = parameters();
  if (!model_has_experts_ &&
      std::none_of(params.begin(), params.end(), [](const nn::Parameter* p) { return p->placement.duplicate(); }))
    return expert ? std::vector<Tensor>{} : local_grads();
  auto counted = [expert](const nn::Parameter* p) { return p->placement.expert == expert && !p->placement.duplicate(); };
  std::vector<Tensor> grads;
  if (dist_optimizer_) {
    for (const auto& [p, g] : dist_optimizer_->param_grad_shards())
      if (counted(p)) grads.push_back(g);
  } else {
    for (nn::Parameter* p : params)
      if (counted(p)) grads.push_back(p->main_grad);
  }
  return grads;
}

optim::GradStatsGroups Trainer::grad_stats_groups() const {
  optim::GradStatsGroups groups;
  // Replicated optimizer: every DP rank holds the same reduced gradients, so the norm is the local one
  // (summed only over model-parallel ranks, which hold different parameters; norm_grads() leaves out the
  // TP replicas). Distributed optimizer: the DP ranks hold disjoint shards, so their squares add up too.
  // Expert gradients likewise over expert-DP and the expert model-parallel group (expert TP x EP x PP).
  if (dist_optimizer_) groups.norm_groups.push_back(parallel_->dp_cp().comm.get());
  groups.norm_groups.push_back(parallel_->model_parallel().comm.get());
  if (model_has_experts_) {
    if (dist_optimizer_) groups.expert_norm_groups.push_back(parallel_->expert_dp().comm.get());
    groups.expert_norm_groups.push_back(parallel_->expert_model_parallel().comm.get());
  }
  groups.found_inf_group = parallel_->world().comm.get();
  return groups;
}

// Megatron FSDP's gathers and reductions around every use of a module group (distributed_data_parallel.h).
nn::ParamHooks Trainer::fsdp_hooks() {
  nn::ParamHooks every;
  every.before_forward = [this](const nn::ParameterList& l) {
    ddp_->acquire_params(ctx_, l);
    ddp_->prefetch_params(ctx_, l, /*forward=*/true);
  };
  every.after_forward = [this](const nn::ParameterList& l) { ddp_->release_params(ctx_, l); };
  // A recomputed forward runs inside backward: the layer's own backward comes next (keep its values), and the
  // next layer in forward order has finished its backward (prefetch nothing).
  every.before_recompute = [this](const nn::ParameterList& l) { ddp_->acquire_params(ctx_, l); };
  every.after_recompute = [this](const nn::ParameterList& l) {
    ddp_->release_params(ctx_, l, /*keep_values=*/true);
  };
  every.before_backward = [this](const nn::ParameterList& l) {
    ddp_->acquire_params(ctx_, l);
    ddp_->prefetch_params(ctx_, l, /*forward=*/false);
    ddp_->begin_grads(ctx_, l);
  };
  every.after_backward = [this](const nn::ParameterList& l) {
    ddp_->end_grads(ctx_, l);
    ddp_->release_params(ctx_, l);
  };
  return every;
}

void Trainer::MicroBatchLosses::record(const HostMicroBatch& mb) {
  loss_tokens.push_back(mb.loss_tokens);
  row_loss_tokens.push_back(mb.row_loss_tokens);
  if (mb.cu_seqlens.defined()) document_squares += trainer::document_squares(mb.cu_seqlens);
}

nn::ForwardOptions Trainer::micro_batch_options(int64_t iteration, int M, int m, bool forward_only, double loss_scale,
                                                const MicroBatchLosses& recorded) const {
  // Dropout masks by the global micro-batch number, so DP = N draws DP = 1's masks for the same samples;
  // gradients of loss * scale / (M x |DP x CP|): the data-parallel average is folded in here and the
  // reduction sums, so every layout computes the same gradient values inside its micro-batches (FP8 casts
  // them); the mask's sum is known here (no device read). Under CP each rank divides by the whole rows'
  // counted tokens / CP (its own count when every token counts), so that the CP ranks' gradients add up to
  // the CP = 1 gradient whatever the masks (Megatron's current loss_func divides by each rank's own count,
  // which weighs the ranks' tokens unequally when their masks differ). Per-token loss: the gradient of the
  // summed loss (times the loss scale), divided by the global token count after the reduction (train_step).
  const double cp = double(parallel_->cp_size());
  const double counted = size_t(m) < recorded.row_loss_tokens.size() ? recorded.row_loss_tokens[size_t(m)] / cp : 0.0;
  const uint64_t dp = uint64_t(parallel_->dp_size()), dp_rank = uint64_t(parallel_->dp().rank());
  return nn::ForwardOptions{
      .training = !forward_only,
      .dropout_step = (uint64_t(iteration) * uint64_t(M) + uint64_t(m)) * dp + dp_rank,
      .grad_scale = per_token_loss_ ? loss_scale : loss_scale / (M * double(parallel_->dp_cp().comm->size())),
      .loss_denominator = per_token_loss_ ? 1.0 : std::max(counted, 1.0 / cp)};  // Megatron clamps to 1
}

Trainer::MicroBatchLosses Trainer::run_micro_batches(SampleStream& data, int64_t iteration, bool forward_only,
                                                    int num_micro_batches) {
  const int M = num_micro_batches;
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const bool reads_data = holds_data_stage();
  // The host prepares micro-batch m + 1 while the device runs micro-batch m; ranks with only middle pipeline
  // stages read nothing and keep the data position.
  HostMicroBatch next;
  if (reads_data) {
    TimerScope timer(forward_only ? nullptr : timers_, "batch-generator", 2, TimerClock::Host);
    next = prepare_micro_batch(data);
  } else {
    data.skip(int64_t(M) * args_.training.micro_batch_size * parallel_->dp_size());
  }
  int expected = 0;
  MicroBatchLosses result;
  pipeline::ScheduleRun run{
      .chunks = chunks_,
      .num_microbatches = M,
      .forward_only = forward_only,
      .batch = args_.training.micro_batch_size,
      .seq = local_seq(),
      .input = [&](int m) {
        MEGATRON_CHECK(m == expected++, "Trainer: micro-batch ", m, "'s data asked for out of order");
        // Outside the timer: the host waits here only when it is a full ring of uploads ahead of the device.
        upload_staging_.wait_for_free_slot();
        TimerScope timer(forward_only ? nullptr : timers_, "batch-generator", 2, TimerClock::Host);
        result.record(next);
        return upload(next);
      },
      .prepare = [&](int) {
        TimerScope timer(forward_only ? nullptr : timers_, "batch-generator", 2, TimerClock::Host);
        next = prepare_micro_batch(data);
      },
      .options = [&](int m) { return micro_batch_options(iteration, M, m, forward_only, loss_scale, result); },
      .hooks = {},
      .p2p = p2p_.get(),
      .timeline = timeline_,
      .timers = forward_only ? nullptr : timers_};
  const distributed::DataParallelConfig& dp_config = ddp_->config();
  if (dp_config.shard_params || dp_config.shard_grads) run.hooks.every_pass = fsdp_hooks();
  if (!forward_only) {
    if (dist_optimizer_ && args_.parallel.overlap_param_gather)  // wait for each bucket's all-gather before its first use
      run.hooks.before_first_forward = [this](const nn::ParameterList& l) { dist_optimizer_->wait_for_params(ctx_, l); };
    if (args_.parallel.overlap_grad_reduce)  // reduce each bucket once its gradients are final
      run.hooks.grads_final = [this](const nn::ParameterList& l) { ddp_->on_grads_final(ctx_, l); };
    if (dist_optimizer_) run.hooks.after_first_forward = [this] { dist_optimizer_->finish_param_gather(ctx_); };
  }
  const pipeline::PipelinePosition position{.size = parallel_->pp_size(), .rank = parallel_->pp().rank(),
                                            .virtual_size = int(chunks_.size())};
  const int group = args_.parallel.microbatch_group_size_per_virtual_pipeline_stage;
  TimelineScope span(forward_only ? nullptr : timeline_, "schedule", "schedule");
  const bool overlap_p2p = !args_.parallel.no_overlap_p2p_communication;
  result.losses =
      pipeline::run_schedule(ctx_, pipeline::schedule_for(position, M, group, forward_only, overlap_p2p), run);
  // While profiling, each stage's schedule span lasts until every stage has finished (a one-element
  // all-reduce over the pipeline group on the stream), so the pipeline's drain counts as idle time on the
  // stages that finish first, as in the bubble's definition (p - 1) / (v * m) per stage.
  if (!forward_only && timeline_ && timeline_->recording() && parallel_->pp_size() > 1) {
    Tensor flag = ctx_.empty({1}, DType::F32);
    ops::fill(ctx_, flag, 0.0);
    parallel_->pp().comm->all_reduce(flag, comm::ReduceOp::Sum, ctx_.stream());
  }
  return result;
}

StepResult Trainer::train_step(SampleStream& train_data, int64_t iteration) {
  StepResult r;
  r.global_batch_size = batch_schedule_.global_batch_size(train_data.consumed());
  num_micro_batches_ = int(r.global_batch_size / (int64_t(args_.training.micro_batch_size) * parallel_->dp_size()));
  ddp_->zero_grads(ctx_);
  adamw().discard_gradient_prefetches();  // a skipped update left its round unconsumed
  MicroBatchLosses losses;
  {
    TimerScope timer(timers_, "forward-backward", 1);
    losses = args_.parallel.hybrid_context_parallel
                 ? run_hybrid_cp_micro_batches(train_data, iteration, num_micro_batches_)
                 : run_micro_batches(train_data, iteration, /*forward_only=*/false, num_micro_batches_);
  }
  {
    TimelineScope span(timeline_, "finalize grads", "grad-reduce");
    distributed::finalize_model_grads(ctx_, *ddp_, parameters(),
                                      {.tensor_parallel = parallel_->tp().comm.get(),
                                       .embedding = parallel_->embedding().comm.get()},
                                      timers_);
    // Megatron updates the routers' expert biases at the end of finalize_model_grads, once per step.
    for (nn::GPTModel* chunk : chunks_)
      for (nn::TransformerLayer& layer : chunk->layers)
        if (layer.moe.defined()) layer.moe.router.update_expert_bias(ctx_);
    // Per-token loss: the reduced gradients of the summed losses over the global batch's counted tokens.
    if (per_token_loss_) {
      const double tokens = global_loss_tokens(losses);
      if (tokens > 0)
        for (const Tensor& g : local_grads()) ops::scale(ctx_, g, g, 1.0 / tokens);
    }
    adamw().join_gradient_prefetches(ctx_);  // nothing writes a gradient before its host copy has read it
  }
  r.loss = mean_loss(losses);
  if (document_flags_.reset_attention_mask) {  // every CP rank of a DP rank holds the same rows: sum over DP
    double squares[1] = {losses.document_squares};
    parallel_->dp().comm->all_reduce_host(squares, comm::ReduceOp::Sum);
    r.document_squares = squares[0];
  }
  r.nan_loss = !std::isfinite(r.loss);

  // Unscale, check for overflow, compute the clip coefficient (agreed over the ranks); then the update with
  // the scheduled lr and weight decay, which applies the coefficient as it reads the gradients.
  TimelineScope span(timeline_, "clip + optimizer", "optimizer");
  TimerScope optimizer_timer(timers_, "optimizer", 1);
  optim::GradPreparation prepared =
      optim::prepare_grads(ctx_, local_grads(), scaler_.get(), args_.training.clip_grad, grad_stats_groups(),
                           norm_grads(false), norm_grads(true), timers_);
  r.learning_rate = scheduler_.lr();
  r.grad_norm = prepared.grad_norm;
  r.skipped = prepared.skip_update;
  if (!args_.training.no_check_for_nan_in_loss_and_grad)  // stop before the update writes NaN into the weights
    check_finite_step(ctx_, iteration, r.loss,
                      args_.training.clip_grad > 0 ? std::optional<double>(r.grad_norm) : std::nullopt, parameters(),
                      parallel_->world_rank());
  // FP8: the iteration's amaxes become the next scales (delayed scaling; reduced over the stage's TP x DP x CP
  // ranks, Transformer Engine's amax group), and the weights' FP8 copies are dropped, to be recast from the
  // updated weights. Before the update: with --fp8-param-gather the optimizer quantises the updated weights
  // with the new scales and records their amaxes for the next iteration.
  for (nn::GPTModel* chunk : chunks_)
    if (chunk->fp8_state()) chunk->fp8_state()->end_iteration(ctx_, parallel_->tp_dp_cp().comm.get());
  if (!r.skipped) {
    const float clip = float(prepared.grad_scale);
    const std::optional<double> decoupled = decoupled_lr();
    if (dist_optimizer_) {
      dist_optimizer_->step(ctx_, scheduler_.lr(), scheduler_.weight_decay(), clip, timers_, decoupled);
    } else {
      TimerScope timer(timers_, "optimizer-inner-step", 1);
      optimizer_->step(ctx_, scheduler_.lr(), scheduler_.weight_decay(), clip, decoupled);
    }
    scheduler_.step(r.global_batch_size);  // Megatron counts the schedule in samples
  }
  return r;
}

std::optional<double> Trainer::decoupled_lr() const {
  const train::TrainingArguments& t = args_.training;
  if (t.decoupled_lr < 0) return std::nullopt;
  return scheduler_.lr(t.decoupled_lr, t.decoupled_min_lr >= 0 ? t.decoupled_min_lr : t.min_lr);
}

double Trainer::mean_loss(const MicroBatchLosses& mb) {
  const std::vector<Tensor>& losses = mb.losses;
  const bool last_stage = !losses.empty() && losses.front().defined();
  if (token_weighted_) {
    // Megatron's report: sum(loss x tokens) and the tokens, summed over micro-batches and DP x CP.
    double weighted = 0.0, tokens = 0.0;
    if (last_stage) {
      Tensor sum = ctx_.empty(Shape{1}, chunks_.front()->config().stats_dtype());
      ops::fill(ctx_, sum, 0.0);
      for (size_t m = 0; m < losses.size(); ++m) {
        ops::axpby(ctx_, sum, losses[m], sum, mb.loss_tokens[m], 1.0);
        tokens += mb.loss_tokens[m];
      }
      weighted = read_scalar(ctx_, sum);
    }
    return token_weighted_mean(weighted, tokens);
  }
  double mean[1] = {0.0};
  if (last_stage) {
    // The micro-batch losses add up on the device and are read once.
    Tensor sum = ctx_.empty(Shape{1}, chunks_.front()->config().stats_dtype());
    ops::fill(ctx_, sum, 0.0);
    for (const Tensor& loss : losses) ops::add(ctx_, sum, sum, loss);
    mean[0] = read_scalar(ctx_, sum) / double(losses.size());
  }
  return agree_on_loss(mean[0]);
}

double Trainer::token_weighted_mean(double weighted_sum, double tokens) {
  double sums[2] = {weighted_sum, tokens};  // the last stage's values (zero on the other stages)
  if (parallel_->pp_size() > 1) parallel_->pp().comm->all_reduce_host(sums, comm::ReduceOp::Sum);
  parallel_->dp_cp().comm->all_reduce_host(sums, comm::ReduceOp::Sum);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

double Trainer::global_loss_tokens(const MicroBatchLosses& mb) {
  double tokens[1] = {0.0};
  const bool last_stage = std::any_of(chunks_.begin(), chunks_.end(),
                                      [](const nn::GPTModel* c) { return c->layout().post_process; });
  if (last_stage)
    for (double t : mb.loss_tokens) tokens[0] += t;
  if (parallel_->pp_size() > 1) parallel_->pp().comm->all_reduce_host(tokens, comm::ReduceOp::Sum);
  parallel_->dp_cp().comm->all_reduce_host(tokens, comm::ReduceOp::Sum);
  return tokens[0];
}

double Trainer::agree_on_loss(double last_stage_value) {
  double value[1] = {last_stage_value};
  if (parallel_->pp_size() > 1) parallel_->pp().comm->all_reduce_host(value, comm::ReduceOp::Sum);  // only one is non-zero
  parallel_->dp_cp().comm->all_reduce_host(value, comm::ReduceOp::Avg);
  return value[0];
}

void Trainer::finish_param_gather() {
  if (dist_optimizer_) dist_optimizer_->finish_param_gather(ctx_);
}

void Trainer::acquire_params_for_checkpoint() {
  finish_param_gather();
  ddp_->acquire_all_params(ctx_);
}

void Trainer::release_params_after_checkpoint(bool loaded) {
  if (loaded) ddp_->store_params(ctx_);
  ddp_->release_all_params(ctx_);
  // Weights kept in FP8 are loaded into their masters (and scales into the state): quantise them again.
  if (loaded && dist_optimizer_) dist_optimizer_->requantize_fp8_params(ctx_);
}

double Trainer::evaluate(SampleStream& data) {
  if (dist_optimizer_) dist_optimizer_->finish_param_gather(ctx_);
  // FP8 evaluation casts with the training scales but records no amaxes; the weights it casts are dropped
  // again so that the next iteration records theirs.
  for (nn::GPTModel* chunk : chunks_)
    if (chunk->fp8_state()) chunk->fp8_state()->set_recording(false);
  double sum = 0, count = 0;
  // Megatron evaluates global batches of --global-batch-size (its eval_global_batch_size default).
  const int M = args_.num_micro_batches();
  for (int64_t it = 0; it < args_.training.eval_iters; ++it) {
    const MicroBatchLosses mb = run_micro_batches(data, 0, /*forward_only=*/true, M);
    for (size_t m = 0; m < mb.losses.size(); ++m) {  // each read in turn, summed in double
      if (!mb.losses[m].defined()) continue;  // not the last pipeline stage
      // Token-weighted (Megatron's report with documents or per-token loss), else each micro-batch alike.
      const double weight = token_weighted_ ? mb.loss_tokens[m] : 1.0;
      sum += weight * read_scalar(ctx_, mb.losses[m]);
      count += weight;
    }
  }
  for (nn::GPTModel* chunk : chunks_)
    if (chunk->fp8_state()) {
      chunk->fp8_state()->set_recording(true);
      chunk->fp8_state()->invalidate_weights();
    }
  // Megatron's evaluate sums the numerators and the token counts over DP x CP.
  return token_weighted_ ? token_weighted_mean(sum, count) : agree_on_loss(count ? sum / double(count) : 0.0);
}

}  // namespace megatron::trainer

namespace megatron::trainer {
namespace {

// A small F32 or F64 tensor's values on the host (waits for the device).
std::vector<double> host_values(Context& ctx, const Tensor& t) {
  if (t.dtype() == DType::F64) {
    std::vector<double> v(size_t(t.numel()));
    copy_tensor(ctx, Tensor::from_blob(v.data(), {t.numel()}, DType::F64, Device::cpu()), t.view({t.numel()}));
    return v;
  }
  std::vector<float> f(size_t(t.numel()));
  copy_tensor(ctx, Tensor::from_blob(f.data(), {t.numel()}, DType::F32, Device::cpu()), t.view({t.numel()}));
  return {f.begin(), f.end()};
}

}  // namespace

std::vector<std::pair<std::string, double>> Trainer::moe_losses(
    int64_t iterations, std::vector<std::pair<std::string, double>>* per_layer) {
  const nn::MoeConfig& moe = chunks_.front()->config().moe;
  if (!moe.enabled()) return {};
  const int L = chunks_.front()->config().num_layers;
  // [layer][metric]: this rank's shares of every layer it holds (zero elsewhere), summed over the world.
  std::vector<double> shares(size_t(L) * nn::kRouterMetrics, 0.0);
  for (nn::GPTModel* chunk : chunks_)
    for (size_t i = 0; i < chunk->layers.size(); ++i) {
      nn::TopKRouter& router = chunk->layers[i].moe.router;
      if (!chunk->layers[i].moe.defined() || !router.metrics().defined()) continue;
      const std::vector<double> m = host_values(ctx_, router.metrics());
      const size_t layer = size_t(chunk->layout().first_layer) + i;
      for (int k = 0; k < nn::kRouterMetrics; ++k) shares[layer * nn::kRouterMetrics + size_t(k)] += m[size_t(k)];
      router.reset_metrics(ctx_);
    }
  parallel_->world().comm->all_reduce_host(shares, comm::ReduceOp::Sum);
  int moe_layers = 0;
  for (int l = 0; l < L; ++l) moe_layers += moe.is_moe_layer(l);
  const double per = double(parallel_->dp_size()) * num_micro_batches_ * double(std::max<int64_t>(iterations, 1)) *
                     std::max(moe_layers, 1);
  bool enabled[nn::kRouterMetrics] = {false, false, moe.z_loss_coeff > 0};
  for (const nn::AuxLoss& a : moe.aux_losses)
    enabled[a.type == nn::AuxLossType::GlobalAuxLoss ? 1 : a.type == nn::AuxLossType::SeqAuxLoss ? 3 : 0] = true;
  std::vector<std::pair<std::string, double>> out;
  for (int k = 0; k < nn::kRouterMetrics; ++k) {
    if (!enabled[k]) continue;
    double sum = 0;
    for (int l = 0; l < L; ++l) sum += shares[size_t(l) * nn::kRouterMetrics + size_t(k)];
    out.emplace_back(nn::router_metric_name(k), sum / per);
    if (per_layer == nullptr) continue;
    const double per_one_layer = per / std::max(moe_layers, 1);
    for (int l = 0; l < L; ++l)
      per_layer->emplace_back(str_cat("moe/", nn::router_metric_name(k), "_layer_", l),
                              shares[size_t(l) * nn::kRouterMetrics + size_t(k)] / per_one_layer);
  }
  return out;
}

double Trainer::params_norm() {
  acquire_params_for_checkpoint();  // every parameter whole on this rank (FSDP gathers them)
  std::vector<Tensor> dense, expert;
  for (nn::Parameter* p : parameters())
    if (!p->placement.duplicate()) (p->placement.expert ? expert : dense).push_back(dequantized(ctx_, *p));
  // The values are the same on every data-parallel rank: the norm sums over the model-parallel ranks only.
  optim::GradStatsGroups groups;
  groups.norm_groups.push_back(parallel_->model_parallel().comm.get());
  if (model_has_experts_) groups.expert_norm_groups.push_back(parallel_->expert_model_parallel().comm.get());
  const double norm = optim::global_grad_norm(ctx_, dense, expert, groups);
  release_params_after_checkpoint(/*loaded=*/false);
  return norm;
}

int64_t Trainer::num_zeros_in_grads() {
  const optim::GradStatsGroups groups = grad_stats_groups();
  auto count = [&](const std::vector<Tensor>& grads, const std::vector<comm::Communicator*>& over) {
    double zeros[1] = {0.0};
    if (!grads.empty()) {
      Tensor n = ctx_.empty({1}, DType::I64);
      ops::multi_tensor_count_zeros(ctx_, n, grads);
      int64_t host = 0;
      copy_tensor(ctx_, Tensor::from_blob(&host, {1}, DType::I64, Device::cpu()), n);
      zeros[0] = double(host);
    }
    for (comm::Communicator* group : over)
      if (group != nullptr) group->all_reduce_host(zeros, comm::ReduceOp::Sum);
    return zeros[0];
  };
  double total = count(norm_grads(false), groups.norm_groups);
  if (model_has_experts_) total += count(norm_grads(true), groups.expert_norm_groups);
  return int64_t(total);
}

}  // namespace megatron::trainer
