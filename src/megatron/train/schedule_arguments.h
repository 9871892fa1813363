// Sample-based training, the batch-size schedule and the weight-decay schedule: Megatron's
// --train-samples, --lr-decay-samples, --lr-warmup-samples, --lr-warmup-fraction, --lr-warmup-init,
// --lr-wsd-decay-samples, --rampup-batch-size, --step-batch-size-schedule, --weight-decay-incr-style,
// --start-weight-decay and --end-weight-decay (flags in schedule_arguments.cpp), with Megatron's rules
// (validate_args and OptimizerParamScheduler's asserts):
//   iteration-based (--train-iters): no *-samples flag, no batch-size schedule; --lr-warmup-fraction instead of
//     --lr-warmup-iters, not with it.
//   sample-based (--train-samples): no --lr-decay-iters or --lr-warmup-iters; --lr-warmup-fraction not with
//     --lr-warmup-samples; train_iters = Megatron's update_train_iters (train/batch_size_schedule.h).
//   a batch-size schedule needs --train-samples; --step-batch-size-schedule not with --global-batch-size
//     (Megatron's rule), not with --rampup-batch-size; every batch size it gives is a multiple of
//     --micro-batch-size x DP.
//   weight decay: constant takes --weight-decay (no start/end); linear and cosine need both, 0 <= start <= end.
//   the warmup is shorter than the decay, both counted in samples (optim/lr_scheduler.h).
#pragma once

#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::train {

// Derives train_iters from --train-samples (idempotent). A schedule that does not parse is left for
// schedule_violations() to report.
void resolve_schedule(Arguments& args);

// Every violated rule, one sentence each naming the flags and values.
std::vector<std::string> schedule_violations(const Arguments& args);

}  // namespace megatron::train
