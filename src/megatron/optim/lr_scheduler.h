// The learning-rate and weight-decay schedule of Megatron-LM's OptimizerParamScheduler
// (megatron/core/optimizer_param_scheduler.py), counted in samples as Megatron counts them: after each
// successful optimizer step the trainer advances it by that iteration's global batch (step(GBS)), so a
// batch-size ramp-up moves the schedule by the samples actually trained.
//
// With n = num_steps() (samples of the successful optimizer steps so far; skipped fp16 iterations do not
// count), the learning rate is, first rule that applies:
//   warmup_steps > 0 and n <= warmup_steps:  init_lr + (max_lr - init_lr) * n / warmup_steps
//   style constant:                          max_lr
//   n > decay_steps:                         min_lr
//   style inverse-square-root:               max(min_lr, max_lr * sqrt(max(warmup, 1)) / sqrt(max(n, 1)))
//   otherwise, r = (n - warmup) / (decay - warmup) in [0, 1]:  min_lr + coeff * (max_lr - min_lr) with
//     linear: 1 - r;  cosine: (cos(pi r) + 1) / 2;
//     WSD: 1 while n <= decay - wsd_decay_steps, then with q = (n - (decay - wsd_decay_steps)) / wsd_decay_steps
//       exponential: 2 * 0.5^q - 1;  linear: 1 - q;  cosine: (cos(pi q) + 1) / 2;  minus_sqrt: 1 - sqrt(q).
// The warmup is a real number of samples (--lr-warmup-fraction x the decay). So n == warmup gives max_lr,
// n == decay gives min_lr (constant: max_lr), and with warmup == 0 the decay starts at n = 0 from max_lr. The lr
// used by the step that follows n samples is lr() at n: the trainer reads lr(), steps the optimizer, then calls
// step(GBS) when the update happened (Megatron's order).
//
// Weight decay (Megatron's start/end/incr schedule):
//   n > wd_incr_steps: end_wd;  constant: end_wd (start_wd must equal end_wd);
//   otherwise r = n / wd_incr_steps, start_wd + coeff * (end_wd - start_wd), linear r, cosine (cos(pi (1 - r)) + 1) / 2.
//
// All arithmetic is in double, like Megatron's Python floats. The constructor rejects what Megatron asserts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "megatron/train/arguments.h"

namespace megatron::optim {

enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WdIncrStyle { Constant, Linear, Cosine };

// Megatron's spellings ("constant", "linear", "cosine", "inverse-square-root", "WSD"; "exponential",
// "linear", "cosine", "minus_sqrt"); throw megatron::Error naming the accepted values otherwise.
LrDecayStyle parse_lr_decay_style(std::string_view name);
WsdDecayStyle parse_wsd_decay_style(std::string_view name);
WdIncrStyle parse_wd_incr_style(std::string_view name);

struct ParamSchedule {
  double init_lr = 0.0;    // lr at step 0 of the warmup (Megatron's --lr-warmup-init)
  double max_lr = 0.0;     // --lr
  double min_lr = 0.0;     // --min-lr
  double warmup_steps = 0;  // samples (a fraction of the decay with --lr-warmup-fraction)
  int64_t decay_steps = 0;  // samples, > warmup_steps
  LrDecayStyle decay_style = LrDecayStyle::Linear;
  int64_t wsd_decay_steps = 0;  // WSD only: the anneal, the last wsd_decay_steps of decay_steps
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  double start_wd = 0.01;
  double end_wd = 0.01;
  int64_t wd_incr_steps = 0;
  WdIncrStyle wd_incr_style = WdIncrStyle::Constant;
};

// The schedule pretrain_gpt builds from resolved arguments, in samples (Megatron's get_optimizer_param_scheduler):
// iteration-based, decay = --lr-decay-iters x GBS, warmup = --lr-warmup-iters x GBS, weight-decay increment over
// --train-iters x GBS, WSD anneal --lr-wsd-decay-iters x GBS; sample-based (--train-samples), decay =
// --lr-decay-samples (default --train-samples), warmup = --lr-warmup-samples, increment over --train-samples, WSD
// --lr-wsd-decay-samples; --lr-warmup-fraction f makes the warmup f x decay; init_lr --lr-warmup-init; weight decay
// --weight-decay when its increment style is constant, else --start-weight-decay to --end-weight-decay.
ParamSchedule schedule_from_arguments(const train::TrainingArguments& args);

class OptimizerParamScheduler {
 public:
  // Throws megatron::Error listing the first violated rule: min_lr >= 0, max_lr >= min_lr,
  // init_lr <= max_lr, decay_steps > 0, warmup_steps < decay_steps, WSD with wsd_decay_steps >= 0,
  // 0 <= start_wd <= end_wd, constant wd with start_wd == end_wd, wd_incr_steps > 0 for non-constant wd.
  explicit OptimizerParamScheduler(const ParamSchedule& schedule);

  // Learning rate at num_steps(); the overload takes a parameter group's own max/min lr.
  double lr() const { return lr(schedule_.max_lr, schedule_.min_lr); }
  double lr(double max_lr, double min_lr) const;
  // Weight decay at num_steps() (before a group's wd_mult; no-decay groups use 0).
  double weight_decay() const;

  // Advances by `increment` samples (Megatron's step(increment): the global batch of a successful step).
  void step(int64_t increment = 1);
  int64_t num_steps() const { return num_steps_; }
  // For resuming from a checkpoint: the count saved by num_steps() (samples).
  void set_num_steps(int64_t n);

  const ParamSchedule& schedule() const { return schedule_; }

 private:
  ParamSchedule schedule_;
  int64_t num_steps_ = 0;
};

}  // namespace megatron::optim
