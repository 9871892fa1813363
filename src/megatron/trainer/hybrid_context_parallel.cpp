// Hybrid (dynamic) context parallelism in the training step, Megatron-Core's --hybrid-context-parallel with
// --max-seqlen-per-dp-cp-rank (trainer.h, parallel/dynamic_cp_schedule.h).
//
// Every CP rank of a data-parallel rank reads the same micro-batches. From their longest documents each rank
// computes the same plan: waves of runs, a run being one micro-batch on an aligned block of c CP ranks (c a power
// of two, the fewest whose c x max_seqlen_per_rank tokens hold the longest document). A rank runs its runs in wave
// order, each as CP rank (rank - first) of c with a model built for c -- the launch's model for c = C, a copy for
// smaller c (no CP for c = 1) whose parameters are the launch model's own tensors, so every run reads the same
// weights and accumulates into the same gradient buffers. Members of a block run the same micro-batches in the same
// order, so each block's collectives match; ranks idle in a wave simply go on.
//
// The function is fixed CP's: with the per-token loss (required), a micro-batch's gradient is the sum over its
// tokens wherever they are computed, the reduction over DP x CP adds every rank's part, and finalize divides by the
// global token count; dropout draws by global position, whatever the split. No hook marks a bucket's gradients final
// during these backwards (the runs per rank differ), so the data-parallel reduction starts after them.
#include "megatron/core/error.h"
#include "megatron/parallel/dynamic_cp_schedule.h"
#include "megatron/trainer/model_chunks.h"
#include "megatron/trainer/trainer.h"

namespace megatron::trainer {

void Trainer::build_hybrid_cp_models() {
  if (!args_.parallel.hybrid_context_parallel) return;
  MEGATRON_CHECK(chunks_.size() == 1, "--hybrid-context-parallel runs a model of one chunk (no pipeline), got ",
                 chunks_.size());
  const int C = parallel_->cp_size(), rank = parallel_->cp().rank();
  const nn::GPTModel& model = *chunks_.front();
  for (int c = 1; c < C; c *= 2) {
    parallel::ContextParallel cp;  // c = 1: none
    if (c > 1) {
      cp.group = parallel_->cp().comm->split(rank / c, rank, str_cat("hybrid-cp-", c));
      cp.comm_types = model.context_parallel().comm_types;
    }
    hybrid_cp_models_[c] = build_model_chunks(ctx_, model.config(), model.tensor_parallel(), cp, args_, 0);
  }
  share_parameters_with_hybrid_cp_models();
}

void Trainer::share_parameters_with_hybrid_cp_models() {
  const nn::ParameterList own = chunks_.front()->parameters();
  for (auto& [c, chunks] : hybrid_cp_models_) {
    const nn::ParameterList copy = chunks.front()->parameters();
    MEGATRON_CHECK(copy.size() == own.size(), "--hybrid-context-parallel: the CP-", c, " model has ", copy.size(),
                   " parameters, the model ", own.size());
    for (size_t i = 0; i < own.size(); ++i) {
      MEGATRON_CHECK(copy[i]->name == own[i]->name && copy[i]->value.shape() == own[i]->value.shape(),
                     "--hybrid-context-parallel: the CP-", c, " model's parameter ", i, " is ", copy[i]->name, " ",
                     copy[i]->value.describe(), ", the model's ", own[i]->name, " ", own[i]->value.describe());
      copy[i]->value = own[i]->value;
      copy[i]->main_grad = own[i]->main_grad;
    }
  }
}

Trainer::MicroBatchLosses Trainer::run_hybrid_cp_micro_batches(SampleStream& data, int64_t iteration, int M) {
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  // No forward hook waits for the distributed optimizer's overlapped gathers here: wait for all of them, and
  // make sure the copies read the model's current tensors.
  if (dist_optimizer_) dist_optimizer_->finish_param_gather(ctx_);
  share_parameters_with_hybrid_cp_models();

  MicroBatchLosses result;
  std::vector<Tensor> samples;
  std::vector<int64_t> longest;
  {
    TimerScope timer(timers_, "batch-generator", 2, TimerClock::Host);
    for (int m = 0; m < M; ++m) {
      samples.push_back(next_micro_batch(data));
      const HostMicroBatch whole = host_micro_batch(samples.back(), data, 1, 0);
      MEGATRON_CHECK(whole.cu_seqlens.defined(), "--hybrid-context-parallel: a micro-batch without document offsets "
                     "(the validation requires --reset-attention-mask or --sft)");
      longest.push_back(longest_document(whole.cu_seqlens));
      result.document_squares += document_squares(whole.cu_seqlens);  // every CP rank holds every row, as fixed CP
    }
  }
  const int C = parallel_->cp_size(), rank = parallel_->cp().rank();
  const std::vector<parallel::CpWave> plan =
      parallel::plan_dynamic_cp(longest, args_.parallel.max_seqlen_per_dp_cp_rank, C);
  for (const parallel::CpRun& run : parallel::runs_of_rank(plan, rank)) {
    if (run.micro_batch < 0) continue;  // idle in this wave
    const int m = int(run.micro_batch);
    const HostMicroBatch mb = host_micro_batch(samples[size_t(m)], data, run.size, rank - run.first_rank);
    result.loss_tokens.push_back(mb.loss_tokens);
    result.row_loss_tokens.push_back(mb.row_loss_tokens);
    nn::GPTModel& model = run.size == C ? *chunks_.front() : *hybrid_cp_models_.at(run.size).front();
    const nn::StageInput input = upload(mb);
    nn::StageOutput out = model.forward(ctx_, input, micro_batch_options(iteration, M, m, false, loss_scale, result));
    result.losses.push_back(out.loss);
    model.backward(ctx_, std::move(out.saved));
  }
  return result;
}

}  // namespace megatron::trainer
