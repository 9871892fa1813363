// One training iteration of pretrain_gpt on one device per rank, data-parallel over a ParallelContext's DP
// group (one rank: a world of one, no MPI).
//
// train_step() is the whole iteration, top to bottom:
//   zero the gradient buffers;
//   run the schedule over this rank's micro-batches of the global batch (Megatron's sampler: micro-batch m
//     of DP rank r is samples [(m * DP + r) * mbs, +mbs) of the iteration): forwards and backwards, gradients
//     accumulating in the fp32 buffers, scaled by 1/num_micro_batches and the loss scale; during the last
//     backward each gradient bucket's reduction starts as soon as it is final (--overlap-grad-reduce);
//   finalize the gradients (distributed/finalize_model_grads.h: finish the DP reduction, sum the
//     sequence-parallel norms' partial gradients over TP);
//   unscale, check for inf/nan and compute the clip coefficient from the global norm, all agreed over the
//     ranks (optim/grad_clip.h);
//   step: AdamW with the scheduled lr and weight decay (or the distributed optimizer: update the shards,
//     all-gather the parameters), skipped when a gradient overflowed; advance the lr schedule.
// The loss returned is the average over DP, so every rank returns the same value.
// Dropout masks are indexed by the global micro-batch number (iteration * M + m) * DP + r, so DP=N uses
// the masks DP=1 uses for the same samples.
// Pipeline parallelism: the trainer holds this rank's model chunks (one per virtual stage, GPTModel stages
// built with the context's PP rank's layer ranges) and runs Megatron's schedule for them (1F1B, or interleaved
// with several chunks; pipeline/schedule.h); only the ranks with the first or the last stage read data (the
// others only advance the data position); the loss is the last stage's, handed to every pipeline rank; the
// gradient norm and the inf check span every stage (the model-parallel group); the tied word embeddings'
// two copies are summed over the embedding group (finalize_model_grads).
// Tensor parallelism: the model is built with the context's TP group (GPTModel's TensorParallel); the TP
// ranks of a DP rank read the same micro-batches and compute the same loss; each holds its pieces of the
// parameters in its own gradient buffers (reduced over DP as above). The gradient norm sums the squares of
// the TP-sharded parameters over TP and counts each replicated one (norms, row-parallel biases, positions)
// once, where its placement says (placement.duplicate()).
// Context parallelism: each rank of a CP group holds chunks r and 2CP-1-r of every sequence of its DP rank's
// micro-batches (parallel/context_parallel.h), tokens and labels cut on the host; the model's attention
// communicates over CP. Each rank's loss is the masked mean over its tokens (Megatron's), the gradients are
// averaged over DP x CP (the data-parallel buffers' group), so with equal token counts per rank the step is
// the CP = 1 step; the reported loss is averaged over DP x CP. The parameters are replicated over CP and the
// distributed optimizer shards over DP x CP.
// Documents (trainer/micro_batch.h): --reset-position-ids, --reset-attention-mask and --eod-mask-loss make each
// micro-batch's positions, documents and loss mask as Megatron's GPTDataset does; each micro-batch's loss is
// then the mean over the tokens its mask counts (Megatron's loss_func / num_tokens), and the reported loss is
// Megatron's: the global batch's summed loss over its counted tokens (micro-batches and DP x CP).
// --calculate-per-token-loss: each micro-batch's gradient is that of its summed loss (times the loss scale,
// no 1/M and no DP average: the reduction sums), and after finalize_model_grads the gradients are divided by
// the global batch's counted tokens (all-reduced over DP x CP), as Megatron's finalize_model_grads does; so
// every token weighs the same whatever the micro-batch, data-parallel rank or context-parallel chunk it is in.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "megatron/nn/gpt_model.h"
#include "megatron/pipeline/executor.h"
#include "megatron/optim/adamw.h"
#include "megatron/optim/distributed_optimizer.h"
#include "megatron/optim/grad_clip.h"
#include "megatron/optim/loss_scaler.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/optim/param_groups.h"
#include "megatron/distributed/distributed_data_parallel.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/runtime/upload_staging.h"
#include "megatron/train/arguments.h"
#include "megatron/train/batch_size_schedule.h"
#include "megatron/trainer/batches.h"
#include "megatron/trainer/micro_batch.h"

namespace megatron::trainer {

struct StepResult {
  double loss = 0;                  // mean over the micro-batches
  double learning_rate = 0;         // the lr this step used
  std::optional<double> grad_norm;  // none when skipped
  bool skipped = false;             // inf/nan gradients (fp16): no update
  bool nan_loss = false;
  int64_t global_batch_size = 0;    // this iteration's (a batch-size schedule changes it)
  // --reset-attention-mask: the sum of the squared document lengths of the global batch's rows (the attention
  // FLOPs, train/flops.h); 0 otherwise.
  double document_squares = 0;
};

class Trainer {
 public:
  // One process (a world of one).
  Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model);
  // Data parallel over `parallel`'s DP group (args.data_parallel_size() must equal it); `parallel` must
  // outlive the trainer. Rebinds the model's gradients (and, with the distributed optimizer, its
  // parameter values) into contiguous buffers.
  Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model, const parallel::ParallelContext& parallel);
  // This rank's model chunks of a pipeline (chunk c: virtual stage c of this pipeline rank), and the rest as above.
  Trainer(Context& ctx, const train::Arguments& args, std::vector<nn::GPTModel*> chunks,
          const parallel::ParallelContext& parallel);
  ~Trainer();

  StepResult train_step(SampleStream& train_data, int64_t iteration);
  // Records each step's spans (schedule, forward/backward/point-to-point, gradient reduction, optimizer) on
  // `timeline` while it is recording; null: none. `timeline` must outlive the trainer or be reset to null.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Megatron's timers (runtime/timers.h; null: none): forward-backward, the gradient reductions and the
  // optimizer's parts (level 1), batch-generator and the schedule's compute and point-to-point timers (level 2).
  // `timers` must outlive the trainer or be reset to null.
  void set_timers(Timers* timers) { timers_ = timers; }
  // --log-params-norm: the L2 norm of every parameter of the model (each replica once: TP-replicated ones on one
  // TP rank, every pipeline stage's and expert's), as Megatron's calc_params_l2_norm. Collective over the world.
  double params_norm();
  // --log-num-zeros-in-grad: the number of zero gradient elements of the last step (each replica once, as the
  // gradient norm counts them). Collective over the world; call between train_step and the next one.
  int64_t num_zeros_in_grads();
  // Mean loss over eval_iters global batches of `data` (no gradients, no dropout), averaged over DP.
  double evaluate(SampleStream& data);

  // The micro-batches per data-parallel rank of the last training iteration (of the first before any).
  int num_micro_batches() const { return num_micro_batches_; }
  // The global batch of the iteration that starts after `consumed_samples` (--rampup-batch-size,
  // --step-batch-size-schedule; else --global-batch-size).
  int64_t global_batch_size(int64_t consumed_samples) const { return batch_schedule_.global_batch_size(consumed_samples); }
  const optim::OptimizerParamScheduler& scheduler() const { return scheduler_; }
  // --decoupled-lr's scheduled value at the schedule's current step (the word embeddings' and output layer's
  // learning rate: the same warmup and decay, from --decoupled-lr down to --decoupled-min-lr, else --min-lr, as
  // Megatron's parameter-group override does); none without the flag.
  std::optional<double> decoupled_lr() const;
  const optim::LossScaler* loss_scaler() const { return scaler_.get(); }
  // Checkpoints save and restore these. optimizer(): the AdamW in use -- the replicated one, or the
  // distributed optimizer's over this rank's ranges (distributed_optimizer() then says which).
  optim::AdamW& optimizer() { return dist_optimizer_ ? dist_optimizer_->adamw() : *optimizer_; }
  const optim::DistributedOptimizer* distributed_optimizer() const { return dist_optimizer_.get(); }
  // Makes ctx's stream wait for the parameter all-gathers still in flight (--overlap-param-gather), as
  // evaluation does; a checkpoint snapshot reads the parameters.
  void finish_param_gather();
  // Around a checkpoint save or load, which read or write every Parameter: the gathers above finished and, with
  // FSDP's sharded parameters, the whole model gathered; after it released again (after a load, `loaded`: the
  // loaded values written back to this rank's shards first).
  void acquire_params_for_checkpoint();
  void release_params_after_checkpoint(bool loaded);
  optim::OptimizerParamScheduler& mutable_scheduler() { return scheduler_; }
  optim::LossScaler* mutable_loss_scaler() { return scaler_.get(); }
  const parallel::ParallelContext& parallel() const { return *parallel_; }
  // The MoE layers' router losses recorded since the last call, as Megatron logs them: each loss's value
  // averaged over micro-batches, data-parallel ranks and the given iterations, then over the MoE layers
  // (names load_balancing_loss, global_load_balancing_loss, z_loss, seq_load_balancing_loss; only the
  // configured ones). Resets the
  // records. Collective over the world (every rank calls it); empty for a dense model. `per_layer` (may be null)
  // receives Megatron's per-layer values, "moe/<name>_layer_<i>" for every layer i of the model (0 for dense
  // layers), averaged over micro-batches, data-parallel ranks and iterations.
  std::vector<std::pair<std::string, double>> moe_losses(
      int64_t iterations, std::vector<std::pair<std::string, double>>* per_layer = nullptr);
  // Bytes of optimizer state (fp32 masters of bf16/fp16 parameters, Adam moments) held by this rank, as
  // computed from the tensors, and as measured: the allocator's growth while the optimizer was built.
  size_t optimizer_state_bytes() const;
  size_t optimizer_host_state_bytes() const;  // --optimizer-cpu-offload: the state in host memory
  size_t optimizer_allocated_bytes() const { return optimizer_allocated_bytes_; }

 private:
  // Builds the data-parallel buffers and the optimizer (both constructors).
  void setup();
  // --fp8-param-gather: each chunk's FP8 linears' weights (with their index in its scaling state), marked to be
  // kept in FP8, and how the distributed optimizer quantises them (their scaling state's weight slots).
  static std::vector<std::pair<int, nn::Parameter*>> fp8_weights(nn::GPTModel& chunk);
  void mark_fp8_params();
  std::vector<optim::Fp8ParamScaling> fp8_param_scalings();
  // This rank's next micro-batch, made on the host (tokens, labels, masks and positions; micro_batch.h).
  HostMicroBatch prepare_micro_batch(SampleStream& data);
  // The host micro-batch of `samples` (read from `data`) as CP rank `cp_rank` of `cp_size` holds it.
  HostMicroBatch host_micro_batch(const Tensor& samples, const SampleStream& data, int cp_size, int cp_rank);
  // Each micro-batch's loss (the last stage's device scalars; empty elsewhere) and the tokens its loss mask
  // counts (on the ranks that read data).
  struct MicroBatchLosses {
    std::vector<Tensor> losses;
    std::vector<double> loss_tokens;
    std::vector<double> row_loss_tokens;  // over the micro-batches' whole rows (every CP rank's tokens)
    double document_squares = 0;          // this rank's micro-batches' (whole rows)
    void record(const HostMicroBatch& mb);  // a micro-batch's counts, as it is handed to the schedule
  };
  // The forward options of micro-batch m of M (dropout addressing, gradient scale, loss denominator).
  nn::ForwardOptions micro_batch_options(int64_t iteration, int M, int m, bool forward_only, double loss_scale,
                                         const MicroBatchLosses& recorded) const;
  // The tokens of each sequence this rank holds (seq_length / CP).
  int64_t local_seq() const;
  // Its device copy (the shared all-ones loss mask where every token counts).
  nn::StageInput upload(const HostMicroBatch& mb);
  // This rank's next micro-batch of `data` (Megatron's sampler slicing).
  Tensor next_micro_batch(SampleStream& data);
  // The schedule over `num_micro_batches` micro-batches of `data`; returns each micro-batch's loss.
  MicroBatchLosses run_micro_batches(SampleStream& data, int64_t iteration, bool forward_only, int num_micro_batches);
  // --hybrid-context-parallel (hybrid_context_parallel.cpp): a copy of the model for each power-of-two CP size c
  // below the launch's, on this rank's aligned block of c CP ranks, computing with the model's own parameter
  // tensors; and the training micro-batches run as parallel/dynamic_cp_schedule.h plans them, each on the CP
  // ranks its longest document needs. Without a pipeline (refused), the model is one chunk.
  void build_hybrid_cp_models();
  void share_parameters_with_hybrid_cp_models();
  MicroBatchLosses run_hybrid_cp_micro_batches(SampleStream& data, int64_t iteration, int num_micro_batches);
  nn::ParamHooks fsdp_hooks();
  // The mean of the micro-batch losses (the last stage's), averaged over DP; every rank gets the same value.
  // With the document flags or the per-token loss, Megatron's token-weighted mean instead: sum(loss x tokens)
  // over micro-batches and DP x CP, divided by the tokens.
  double mean_loss(const MicroBatchLosses& losses);
  // sum(weighted_sum) / sum(tokens) over the pipeline and DP x CP (the last stage's values; zero elsewhere).
  double token_weighted_mean(double weighted_sum, double tokens);
  // The last stage's counted tokens of the global batch, on every rank.
  double global_loss_tokens(const MicroBatchLosses& losses);
  // The last pipeline stage's value on every rank, averaged over DP.
  double agree_on_loss(double last_stage_value);
  // Every parameter of every chunk, in model order.
  nn::ParameterList parameters() const;
  optim::AdamW& adamw();  // the optimizer's AdamW (the distributed optimizer's, or the replicated one)
  void prefetch_offloaded_gradients();  // setup(): hands reduced buckets to the offload's copies (adamw.h)
  bool holds_data_stage() const;  // this rank has the first or the last stage
  // The gradients this rank passes to unscaling, the norm and clipping, and the groups they reduce over.
  std::vector<Tensor> local_grads() const;
  // The part of local_grads() this rank contributes to the gradient norm (all of it without TP and experts):
  // the dense parameters' or (expert) the expert parameters' gradients, replicas left out.
  std::vector<Tensor> norm_grads(bool expert) const;
  optim::GradStatsGroups grad_stats_groups() const;

  Context& ctx_;
  const train::Arguments& args_;
  std::vector<nn::GPTModel*> chunks_;
  std::unique_ptr<parallel::ParallelContext> own_parallel_;  // the world of one, for the first constructor
  const parallel::ParallelContext* parallel_ = nullptr;
  std::unique_ptr<distributed::DistributedDataParallel> ddp_;
  std::unique_ptr<optim::AdamW> optimizer_;                       // replicated over DP
  std::unique_ptr<optim::DistributedOptimizer> dist_optimizer_;  // or sharded (--use-distributed-optimizer)
  bool model_has_experts_ = false;  // on any rank: the expert gradients' norm is reduced over the expert groups
  optim::OptimizerParamScheduler scheduler_;
  train::BatchSizeSchedule batch_schedule_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<pipeline::PipelineComm> p2p_;  // with PP > 1
  Timeline* timeline_ = nullptr;
  Timers* timers_ = nullptr;
  int num_micro_batches_ = 1;
  size_t optimizer_allocated_bytes_ = 0;
  CpuAllocator host_;
  // The micro-batches' uploads, through page-locked buffers: the host prepares and queues the next micro-batch
  // without waiting for the device (four slots: up to four uploads queued ahead of the device).
  UploadStaging upload_staging_{ctx_, 4};
  Tensor loss_mask_;  // [mbs, local seq] of ones on the device: every token counts
  data::DocumentFlags document_flags_;
  bool per_token_loss_ = false;   // --calculate-per-token-loss
  bool token_weighted_ = false;   // the reported loss weighs micro-batches by their counted tokens
  std::map<int, std::vector<std::unique_ptr<nn::GPTModel>>> hybrid_cp_models_;  // by CP size, below the launch's
};

}  // namespace megatron::trainer
