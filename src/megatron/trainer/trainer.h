// The training loop of pretrain_gpt on one device (CPU or one GPU).
//
// train_step() is the whole iteration, top to bottom: zero the gradient buffers; for each micro-batch of
// the global batch, forward and backward (gradients accumulate in fp32, scaled by 1/num_micro_batches and
// the loss scale); unscale, check for inf/nan, clip by the global norm; AdamW with the scheduled lr and
// weight decay (skipped when a gradient overflowed); advance the schedule.
#pragma once

#include <memory>
#include <optional>

#include "megatron/nn/gpt_model.h"
#include "megatron/optim/adamw.h"
#include "megatron/optim/grad_clip.h"
#include "megatron/optim/loss_scaler.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/train/arguments.h"
#include "megatron/trainer/batches.h"

namespace megatron::trainer {

struct StepResult {
  double loss = 0;                  // mean over the micro-batches
  double learning_rate = 0;         // the lr this step used
  std::optional<double> grad_norm;  // none when skipped
  bool skipped = false;             // inf/nan gradients (fp16): no update
  bool nan_loss = false;
};

class Trainer {
 public:
  Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model);

  StepResult train_step(SampleStream& train_data, int64_t iteration);
  // Mean loss over eval_iters global batches of `data` (no gradients, no dropout).
  double evaluate(SampleStream& data);

  int num_micro_batches() const { return num_micro_batches_; }
  const optim::OptimizerParamScheduler& scheduler() const { return scheduler_; }
  const optim::LossScaler* loss_scaler() const { return scaler_.get(); }
  // Checkpoints (issue 7) save and restore these.
  optim::AdamW& optimizer() { return *optimizer_; }
  optim::OptimizerParamScheduler& mutable_scheduler() { return scheduler_; }
  optim::LossScaler* mutable_loss_scaler() { return scaler_.get(); }

 private:
  // Splits samples [mbs, s+1] into tokens, labels and an all-ones loss mask on the device.
  void load_micro_batch(const Tensor& samples);

  Context& ctx_;
  const train::Arguments& args_;
  nn::GPTModel& model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::OptimizerParamScheduler scheduler_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::vector<Tensor> grads_;
  int num_micro_batches_ = 1;
  CpuAllocator host_;
  Tensor tokens_, labels_, loss_mask_;
};

}  // namespace megatron::trainer
