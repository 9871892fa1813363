#include "megatron/train/schedule_arguments.h"

#include "megatron/core/error.h"
#include "megatron/train/batch_size_schedule.h"
#include "megatron/train/flag_spec.h"

namespace megatron::train {

using A = Arguments;
using T = TrainingArguments;

std::vector<FlagSpec> schedule_flags() {
  return {
      flag("--train-samples", &A::training, &T::train_samples,
           "train for this many samples instead of --train-iters (the iterations follow from the batch-size schedule)"),
      flag("--lr-decay-samples", &A::training, &T::lr_decay_samples, "sample-based: decay length (default --train-samples)"),
      flag("--lr-warmup-samples", &A::training, &T::lr_warmup_samples, "sample-based: linear warmup samples"),
      flag("--lr-warmup-fraction", &A::training, &T::lr_warmup_fraction,
           "warmup as a fraction of the decay (instead of --lr-warmup-iters/-samples; -1: not given)"),
      flag("--lr-warmup-init", &A::training, &T::lr_warmup_init, "the warmup's first learning rate"),
      flag("--lr-wsd-decay-samples", &A::training, &T::lr_wsd_decay_samples, "sample-based WSD: anneal samples"),
      flag("--weight-decay-incr-style", &A::training, &T::weight_decay_incr_style,
           "weight decay from --start-weight-decay to --end-weight-decay over the run", {"constant", "linear", "cosine"}),
      flag("--start-weight-decay", &A::training, &T::start_weight_decay,
           "linear/cosine: the first weight decay (-1: not given)"),
      flag("--end-weight-decay", &A::training, &T::end_weight_decay, "linear/cosine: the last weight decay (-1: not given)"),
      flag("--rampup-batch-size", &A::training, &T::rampup_batch_size,
           "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT over SAMPLES samples (Megatron's "
           "ramp-up; needs --train-samples)"),
      flag("--step-batch-size-schedule", &A::training, &T::step_batch_size_schedule,
           "\"THRESHOLD:BS ...\": the global batch from each threshold of tokens on (K/M/B/T suffixes; needs "
           "--train-samples, not with --global-batch-size)"),
  };
}

void resolve_schedule(Arguments& a) {
  TrainingArguments& t = a.training;
  if (t.train_samples <= 0 || (t.train_iters > 0 && !t.iterations_from_samples)) return;
  try {
    t.train_iters = BatchSizeSchedule::from_arguments(a).train_iters(t.train_samples);
    t.iterations_from_samples = true;
  } catch (const Error&) {  // reported by schedule_violations
  }
}

namespace {

void mode_violations(const TrainingArguments& t, std::vector<std::string>& v) {
  const bool schedule = !t.rampup_batch_size.empty() || !t.step_batch_size_schedule.empty();
  if (!t.iterations_from_samples && t.train_iters > 0) {  // iteration-based, as Megatron asserts
    if (t.train_samples > 0) v.push_back("--train-iters and --train-samples are mutually exclusive: give one");
    if (t.lr_decay_samples > 0) v.push_back("--lr-decay-samples needs --train-samples (with --train-iters use --lr-decay-iters)");
    if (t.lr_warmup_samples > 0) v.push_back("--lr-warmup-samples needs --train-samples (with --train-iters use --lr-warmup-iters)");
    if (t.lr_wsd_decay_samples > 0) v.push_back("--lr-wsd-decay-samples needs --train-samples (with --train-iters use --lr-wsd-decay-iters)");
    if (t.lr_warmup_fraction >= 0 && t.lr_warmup_iters > 0)
      v.push_back("give one of --lr-warmup-fraction and --lr-warmup-iters");
    if (schedule)
      v.push_back(str_cat(t.rampup_batch_size.empty() ? "--step-batch-size-schedule" : "--rampup-batch-size",
                          " needs sample-based training: give --train-samples instead of --train-iters"));
  }
  if (t.iterations_from_samples) {
    if (t.lr_decay_iters > 0) v.push_back("--lr-decay-iters needs --train-iters (with --train-samples use --lr-decay-samples)");
    if (t.lr_warmup_iters > 0) v.push_back("--lr-warmup-iters needs --train-iters (with --train-samples use --lr-warmup-samples)");
    if (t.lr_wsd_decay_iters > 0) v.push_back("--lr-wsd-decay-iters needs --train-iters (with --train-samples use --lr-wsd-decay-samples)");
    if (t.lr_warmup_fraction >= 0 && t.lr_warmup_samples > 0)
      v.push_back("give one of --lr-warmup-fraction and --lr-warmup-samples");
  }
  if (t.lr_warmup_fraction >= 0)
    if (t.lr_warmup_fraction >= 1) v.push_back(str_cat("--lr-warmup-fraction ", t.lr_warmup_fraction, " must be below 1"));
}

void weight_decay_violations(const TrainingArguments& t, std::vector<std::string>& v) {
  if (t.weight_decay_incr_style == "constant") {
    if (t.start_weight_decay >= 0 || t.end_weight_decay >= 0)
      v.push_back("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine (constant uses "
                  "--weight-decay)");
    return;
  }
  if (t.start_weight_decay < 0 || t.end_weight_decay < 0) {
    v.push_back(str_cat("--weight-decay-incr-style ", t.weight_decay_incr_style,
                        " needs --start-weight-decay and --end-weight-decay"));
    return;
  }
  if (t.end_weight_decay < t.start_weight_decay)
    v.push_back(str_cat("--end-weight-decay ", t.end_weight_decay, " must be >= --start-weight-decay ", t.start_weight_decay,
                        " (Megatron's scheduler only increases the weight decay)"));
}

// The lengths the scheduler counts, in samples, as Megatron's get_optimizer_param_scheduler computes them.
void length_violations(const TrainingArguments& t, std::vector<std::string>& v) {
  if (t.train_iters <= 0) return;
  const double gbs = double(t.global_batch_size);
  const bool samples = t.iterations_from_samples;
  const double decay = samples ? double(t.lr_decay_samples > 0 ? t.lr_decay_samples : t.train_samples)
                               : double(t.lr_decay_iters) * gbs;
  const double warmup = t.lr_warmup_fraction >= 0 ? t.lr_warmup_fraction * decay
                        : samples                 ? double(t.lr_warmup_samples)
                                                  : double(t.lr_warmup_iters) * gbs;
  if (!(warmup < decay))
    v.push_back(str_cat("the learning-rate warmup (", warmup, " samples: ",
                        samples ? "--lr-warmup-samples/-fraction" : "--lr-warmup-iters/-fraction",
                        ") must be shorter than the decay (", decay, " samples: ",
                        samples ? "--lr-decay-samples, default --train-samples" : "--lr-decay-iters, default --train-iters", ")"));
  if (t.lr_decay_style == "WSD" && (samples ? t.lr_wsd_decay_samples : t.lr_wsd_decay_iters) <= 0)
    v.push_back(str_cat("--lr-decay-style WSD needs a positive ", samples ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters"));
}

void batch_schedule_violations(const Arguments& a, std::vector<std::string>& v) {
  const TrainingArguments& t = a.training;
  if (!t.rampup_batch_size.empty() && t.rampup_batch_size.size() != 3)
    v.push_back(str_cat("--rampup-batch-size takes three values (start batch size, increment, ramp-up samples), got ",
                        t.rampup_batch_size.size()));
  if (!t.step_batch_size_schedule.empty() && !t.rampup_batch_size.empty())
    v.push_back("give one of --rampup-batch-size and --step-batch-size-schedule (Megatron replaced the first by the second)");
  if (!t.step_batch_size_schedule.empty() && !t.global_batch_size_defaulted)
    v.push_back("cannot specify both --step-batch-size-schedule and --global-batch-size (Megatron's rule: the schedule "
                "gives every batch size; drop --global-batch-size)");
  if (t.rampup_batch_size.empty() && t.step_batch_size_schedule.empty()) return;
  try {
    const BatchSizeSchedule s = BatchSizeSchedule::from_arguments(a);
    const int64_t unit = int64_t(t.micro_batch_size) * std::max(1, a.data_parallel_size());
    for (int64_t size : s.sizes())
      if (unit > 0 && size % unit != 0)
        v.push_back(str_cat("the batch-size schedule reaches a global batch of ", size, ", not a multiple of ",
                            "--micro-batch-size ", t.micro_batch_size, " x data-parallel size ", a.data_parallel_size(),
                            " = ", unit));
    if (a.parallel.virtual_pipeline_size > 1)
      v.push_back("a batch-size schedule changes the micro-batches per iteration, which the interleaved pipeline schedule "
                  "ties to its micro-batch groups: train at one --global-batch-size, or without virtual pipeline stages");
  } catch (const Error& e) {
    v.push_back(e.what());
  }
}

}  // namespace

std::vector<std::string> schedule_violations(const Arguments& a) {
  const TrainingArguments& t = a.training;
  std::vector<std::string> v;
  mode_violations(t, v);
  weight_decay_violations(t, v);
  length_violations(t, v);
  batch_schedule_violations(a, v);
  return v;
}

}  // namespace megatron::train
