#include "megatron/train/logging_arguments.h"

#include <csignal>
#include <filesystem>

#include "megatron/core/error.h"
#include "megatron/train/flag_spec.h"

namespace megatron::train {

using A = Arguments;
using L = LoggingArguments;

namespace {

const char* kWandb = "Weights & Biases has no maintained C++ writer; write TensorBoard event files instead "
                     "(--tensorboard-dir DIR: `tensorboard --logdir DIR` shows them, and W&B's TensorBoard sync can "
                     "upload them); drop the flag";

std::vector<FlagSpec> timing_flags() {
  return {
      flag("--timing-log-level", &A::logging, &L::timing_log_level,
           "Megatron's timers: 0 none (no overhead), 1 once-per-iteration ones (forward-backward, gradient "
           "reductions, optimizer), 2 also per micro-batch (forward-compute, backward-compute, batch-generator, "
           "pipeline send/recv); printed every --log-interval by the last rank",
           {"0", "1", "2"}),
      flag("--timing-log-option", &A::logging, &L::timing_log_option,
           "how timers are reported across ranks: max, minmax (Megatron's default) or all", {"max", "minmax", "all"}),
      flag("--log-throughput", &A::logging, &L::log_throughput,
           "the log line always shows TFLOP/s per GPU here; this also writes TensorBoard's 'throughput' (with "
           "--log-timers-to-tensorboard, as Megatron)"),
      flag("--log-params-norm", &A::logging, &L::log_params_norm,
           "print the parameters' L2 norm (over every rank's parameters, replicas once) in the log line"),
      flag("--log-num-zeros-in-grad", &A::logging, &L::log_num_zeros_in_grad,
           "print the number of zeros in the gradients (over every rank's, replicas once) in the log line"),
  };
}

std::vector<FlagSpec> tensorboard_flags() {
  return {
      flag("--tensorboard-dir", &A::logging, &L::tensorboard_dir,
           "write TensorBoard event files here (the last rank; Megatron's scalars and tags)"),
      flag("--tensorboard-log-interval", &A::logging, &L::tensorboard_log_interval,
           "iterations between the per-iteration TensorBoard scalars"),
      flag("--tensorboard-queue-size", &A::logging, &L::tensorboard_queue_size,
           "scalars buffered before the event file is flushed (it is also flushed after every log line)"),
      flag("--log-timers-to-tensorboard", &A::logging, &L::log_timers_to_tensorboard,
           "write iteration-time and the timers of --timing-log-level (max over ranks, s per iteration)"),
      flag("--log-memory-to-tensorboard", &A::logging, &L::log_memory_to_tensorboard,
           "write the allocator's memory statistics (mem-reserved-bytes, mem-allocated-bytes, ...)"),
      flag("--log-validation-ppl-to-tensorboard", &A::logging, &L::log_validation_ppl_to_tensorboard,
           "also write the validation perplexity"),
      flag("--log-world-size-to-tensorboard", &A::logging, &L::log_world_size_to_tensorboard,
           "write the world size"),
      flag("--no-log-loss-scale-to-tensorboard", &A::logging, &L::no_log_loss_scale_to_tensorboard,
           "do not write loss-scale (written by default, as Megatron)"),
      refused_flag("--wandb-project", FlagForm::Value, kWandb),
      refused_flag("--wandb-exp-name", FlagForm::Value, kWandb),
      refused_flag("--wandb-save-dir", FlagForm::Value, kWandb),
      refused_flag("--wandb-entity", FlagForm::Value, kWandb),
  };
}

std::vector<FlagSpec> straggler_and_exit_flags() {
  return {
      flag("--log-straggler", &A::logging, &L::log_straggler,
           "every --log-interval, each rank's throughput over its own work (data, forward, backward); the slowest "
           "and fastest ranks printed with their layout position and host (rank 0) and written to TensorBoard"),
      flag("--straggler-minmax-count", &A::logging, &L::straggler_minmax_count,
           "how many of the slowest and of the fastest ranks the straggler report lists"),
      noop_flag("--straggler-ctrlr-port", FlagForm::Value,
                "Megatron's rank-0 HTTP endpoint that turns the straggler detector on and off while training is "
                "not served here: with --log-straggler the detector runs for the whole job"),
      refused_flag("--disable-straggler-on-startup", FlagForm::Switch,
                   "the straggler detector has no runtime switch here (Megatron's --straggler-ctrlr-port endpoint) "
                   "that could turn it on later; drop --log-straggler instead"),
      flag("--exit-signal-handler", &A::logging, &L::exit_signal_handler,
           "on --exit-signal (and SIGINT) every rank finishes its iteration, the run saves a checkpoint (--save) "
           "and exits with status 0 (the signal is agreed over the ranks each iteration; under mpirun see "
           "docs/observability.md)"),
      flag("--exit-signal", &A::logging, &L::exit_signal, "the signal --exit-signal-handler catches",
           {"SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"}),
  };
}

}  // namespace

std::vector<FlagSpec> logging_flags() {
  std::vector<FlagSpec> all = timing_flags();
  for (auto group : {&tensorboard_flags, &straggler_and_exit_flags})
    for (FlagSpec& f : group()) all.push_back(std::move(f));
  return all;
}

int exit_signal_number(const std::string& name) {
  if (name == "SIGTERM") return SIGTERM;
  if (name == "SIGINT") return SIGINT;
  if (name == "SIGUSR1") return SIGUSR1;
  if (name == "SIGUSR2") return SIGUSR2;
  if (name == "SIGHUP") return SIGHUP;
  return 0;
}

bool tensorboard_available() { return MEGATRON_WITH_TENSORBOARD; }

std::vector<std::string> logging_violations(const Arguments& a) {
  const LoggingArguments& l = a.logging;
  std::vector<std::string> v;
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  need(l.timing_log_level >= 0 && l.timing_log_level <= 2, "--timing-log-level ", l.timing_log_level,
       " must be 0, 1 or 2");
  need(l.tensorboard_log_interval > 0, "--tensorboard-log-interval must be positive (got ", l.tensorboard_log_interval,
       ")");
  need(l.tensorboard_queue_size > 0, "--tensorboard-queue-size must be positive (got ", l.tensorboard_queue_size, ")");
  need(l.straggler_minmax_count > 0, "--straggler-minmax-count must be positive (got ", l.straggler_minmax_count, ")");
  need(exit_signal_number(l.exit_signal) != 0, "--exit-signal ", l.exit_signal,
       " must be one of SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP");
  need(l.tensorboard_dir.empty() || tensorboard_available(), "--tensorboard-dir ", l.tensorboard_dir,
       ": this build writes no TensorBoard event files (Protobuf was not found when it was configured: install "
       "libprotobuf-dev and protobuf-compiler, then reconfigure)");
  const TrainingArguments& t = a.training;
  need(!t.profile || !t.use_pytorch_profiler || !profile_trace_dir(a).empty(),
       "--use-pytorch-profiler writes its trace to --profile-dir, or as Megatron to <--tensorboard-dir>/../torch_profile: "
       "give one of them");
  return v;
}

std::string profile_trace_dir(const Arguments& a) {
  const TrainingArguments& t = a.training;
  if (!t.profile) return "";
  if (!t.profile_dir.empty() || !t.use_pytorch_profiler || a.logging.tensorboard_dir.empty()) return t.profile_dir;
  return (std::filesystem::path(a.logging.tensorboard_dir) / ".." / "torch_profile").lexically_normal().string();
}

}  // namespace megatron::train
