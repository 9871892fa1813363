// What a run reports and how it leaves: Megatron's --timing-log-level/--timing-log-option, --log-throughput,
// --log-params-norm, --log-num-zeros-in-grad, the TensorBoard flags (--tensorboard-dir, --tensorboard-log-interval,
// --tensorboard-queue-size, --log-timers-to-tensorboard, --log-memory-to-tensorboard,
// --log-validation-ppl-to-tensorboard, --log-world-size-to-tensorboard, --no-log-loss-scale-to-tensorboard), the
// straggler detector's (--log-straggler, --straggler-minmax-count, --straggler-ctrlr-port) and
// --exit-signal-handler with --exit-signal (flags in logging_arguments.cpp), with their rules:
//   --timing-log-level 0..2, --timing-log-option max|minmax|all (Megatron's default minmax);
//   --tensorboard-dir needs a build with Protobuf; the other TensorBoard flags do nothing without it (as in
//   Megatron, where they have no writer to write to);
//   --tensorboard-log-interval, --tensorboard-queue-size and --straggler-minmax-count are positive;
//   --use-pytorch-profiler with --profile needs somewhere to write (--profile-dir or --tensorboard-dir);
//   --exit-signal names a signal this build can catch (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP);
//   Weights & Biases (--wandb-*) is refused: there is no maintained C++ writer; TensorBoard takes its place.
// docs/observability.md says what each one shows.
#pragma once

#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::train {

// Every violated rule, one sentence each naming the flags and values.
std::vector<std::string> logging_violations(const Arguments& args);

// The number of `name` ("SIGTERM"), or 0 when it is not one --exit-signal accepts.
int exit_signal_number(const std::string& name);

// Where a profiled run (--profile) writes its Chrome traces: --profile-dir; with --use-pytorch-profiler and no
// --profile-dir, Megatron's place <--tensorboard-dir>/../torch_profile; "" when nothing is traced.
std::string profile_trace_dir(const Arguments& args);

// Whether this build writes TensorBoard event files (Protobuf was found at configure time).
bool tensorboard_available();

}  // namespace megatron::train
