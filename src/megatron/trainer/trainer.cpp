#include "megatron/trainer/trainer.h"

#include <cmath>

#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::trainer {
namespace {

std::vector<optim::AdamWParam> adamw_params(const nn::ParameterList& params) {
  std::vector<optim::AdamWParam> out;
  for (nn::Parameter* p : params) out.push_back({p->value, p->main_grad, p->no_weight_decay});
  return out;
}

}  // namespace

Trainer::Trainer(Context& ctx, const train::Arguments& args, nn::GPTModel& model)
    : ctx_(ctx),
      args_(args),
      model_(model),
      scheduler_(optim::schedule_from_arguments(args.training)),
      scaler_(optim::make_loss_scaler(args.training)) {
  optimizer_ = std::make_unique<optim::AdamW>(
      ctx, adamw_params(model.parameters()),
      optim::AdamWOptions{args.training.adam_beta1, args.training.adam_beta2, args.training.adam_eps});
  for (nn::Parameter* p : model.parameters()) grads_.push_back(p->main_grad);
  const auto& t = args.training;
  num_micro_batches_ = int(t.global_batch_size / (int64_t(t.micro_batch_size) * args.data_parallel_size()));
  const int64_t s = args.model.seq_length, b = t.micro_batch_size;
  tokens_ = ctx.empty(Shape{b, s}, DType::I64);
  labels_ = ctx.empty(Shape{b, s}, DType::I64);
  loss_mask_ = ctx.empty(Shape{b, s}, DType::F32);
  ops::fill(ctx, loss_mask_, 1.0);
}

void Trainer::load_micro_batch(const Tensor& samples) {
  const int64_t b = samples.dim(0), width = samples.dim(1), s = width - 1;
  Tensor tokens = Tensor::empty(Shape{b, s}, DType::I64, host_), labels = Tensor::empty(Shape{b, s}, DType::I64, host_);
  const int64_t* src = samples.data<int64_t>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < s; ++j) {
      tokens.data<int64_t>()[i * s + j] = src[i * width + j];
      labels.data<int64_t>()[i * s + j] = src[i * width + j + 1];
    }
  copy_tensor(ctx_, tokens_, tokens);
  copy_tensor(ctx_, labels_, labels);
}

StepResult Trainer::train_step(SampleStream& train_data, int64_t iteration) {
  StepResult r;
  nn::ParameterList params = model_.parameters();
  nn::zero_grads(ctx_, params);

  // Forward and backward over the micro-batches; gradients of loss * scale / M accumulate in fp32.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  double loss_sum = 0;
  for (int m = 0; m < num_micro_batches_; ++m) {
    load_micro_batch(train_data.next(args_.training.micro_batch_size, host_));
    nn::StepOptions step{.dropout_step = uint64_t(iteration) * uint64_t(num_micro_batches_) + uint64_t(m),
                         .grad_scale = loss_scale / num_micro_batches_,
                         // The mask is all ones: its sum is known here, which saves a device read.
                         .loss_denominator = double(loss_mask_.numel())};
    loss_sum += model_.forward_backward(ctx_, tokens_, labels_, loss_mask_, step);
  }
  r.loss = loss_sum / num_micro_batches_;
  r.nan_loss = !std::isfinite(r.loss);

  // Unscale, check for overflow, compute the clip coefficient; then the update with the scheduled lr and
  // weight decay, which applies the coefficient as it reads the gradients.
  optim::GradPreparation prepared = optim::prepare_grads(ctx_, grads_, scaler_.get(), args_.training.clip_grad);
  r.learning_rate = scheduler_.lr();
  r.grad_norm = prepared.grad_norm;
  r.skipped = prepared.skip_update;
  if (!r.skipped) {
    optimizer_->step(ctx_, scheduler_.lr(), scheduler_.weight_decay(), float(prepared.grad_scale));
    scheduler_.step(1);
  }
  return r;
}

double Trainer::evaluate(SampleStream& data) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t it = 0; it < args_.training.eval_iters; ++it)
    for (int m = 0; m < num_micro_batches_; ++m) {
      load_micro_batch(data.next(args_.training.micro_batch_size, host_));
      sum += model_.forward_loss(ctx_, tokens_, labels_, loss_mask_);
      ++count;
    }
  return count ? sum / double(count) : 0.0;
}

}  // namespace megatron::trainer
