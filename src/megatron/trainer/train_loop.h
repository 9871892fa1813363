// TrainLoop: the iterations of a run after its setup (pretrain.h), Megatron's train() loop:
//   for iteration = start + 1 .. --train-iters:
//     Trainer::train_step;
//     every --log-interval (and at the last iteration): Megatron's log line on the last rank, averaged over
//       the interval (loss, time per iteration, TFLOP/s and tokens/s per GPU; the learning rate after the
//       iteration's scheduler step, Megatron's convention; --log-num-zeros-in-grad and --log-params-norm add
//       theirs), Megatron's timer report (--timing-log-level, --timing-log-option: timer_report.h), the
//       straggler report (--log-straggler: straggler_detector.h), and once, each rank's peak memory next to
//       the model state allocated before the first step, and Megatron's memory line on data-parallel rank 0s;
//     every --tensorboard-log-interval: Megatron's TensorBoard scalars (tensorboard_log.h), flushed after each
//       log line;
//     every --eval-interval: the validation loss and perplexity (last rank);
//     publish a finished asynchronous save; save every --save-interval (Megatron's save-checkpoint timer
//       printed after each save);
//     stop at --exit-interval, once --exit-duration-in-mins has passed on any rank, or once any rank has
//       received --exit-signal (--exit-signal-handler: exit_signal.h), agreed over the world, so every rank
//       stops after the same iteration;
//   then save the last iteration (Megatron saves when a run stops), wait for an asynchronous save in flight,
//   and evaluate on the test split.
// Profiling (--profile): iterations [--profile-step-start, --profile-step-end) are marked for an external
// profiler (cudaProfilerStart/Stop, NVTX ranges); with --profile-dir every rank also records its timeline over
// them, the ranks of --profile-ranks (default 0) write it as a Chrome trace (trace_rank_<r>.json, merged by
// rank 0 into trace.json), and rank 0 reports each pipeline stage's measured bubble -- idle time over compute
// time in the schedule -- next to the ideal (p - 1) / (v * m). With --use-pytorch-profiler the profiled ranks'
// traces also hold what their GPU ran (kernels and copies per stream), and each prints how busy its GPU was per
// iteration and the last iteration's time by kernel; without --profile-dir the traces go where Megatron puts
// its PyTorch profiles, <--tensorboard-dir>/../torch_profile.
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "megatron/runtime/timers.h"
#include "megatron/trainer/exit_signal.h"
#include "megatron/trainer/run_checkpoints.h"
#include "megatron/trainer/straggler_detector.h"
#include "megatron/trainer/tensorboard_log.h"
#include "megatron/trainer/trainer.h"

namespace megatron::trainer {

struct RunStreams {
  SampleStream train, valid, test;
};

class TrainLoop {
 public:
  // `world`: every rank of the run (exit agreement); all references must outlive the loop.
  TrainLoop(Context& ctx, const train::Arguments& args, Trainer& trainer, RunCheckpoints& checkpoints,
            RunStreams& streams, comm::Communicator& world);
  ~TrainLoop();

  // Runs iterations start_iteration + 1 .. the end; returns the last iteration run.
  int64_t run(int64_t start_iteration);

 private:
  // Accumulates one iteration into the interval, writes its TensorBoard scalars, and prints the log line and
  // the interval's reports when the interval is complete. Collective (every rank calls it).
  void log(int64_t iteration, const StepResult& r, double seconds);
  bool log_iteration(int64_t iteration) const;
  void print_log_line(int64_t iteration, const StepResult& r);
  // The timer and straggler reports of the interval that ends at `iteration` (collective), then the timers reset.
  void report_interval(int64_t iteration, double seconds_per_iteration, int64_t global_batch_size);
  void write_tensorboard(int64_t iteration, const StepResult& r);
  void print_memory_once(int64_t iteration);
  void print_evaluation(const std::string& where, double loss) const;
  void evaluate_validation(int64_t iteration);
  // A checkpoint of `iteration` (when --save is given), timed by Megatron's save-checkpoint timer.
  void save_checkpoint(int64_t iteration);
  bool should_exit(int64_t iteration);
  // Saves iteration - 1 when the global batch of `iteration` differs from `batch` (then updated).
  void save_when_batch_grows(int64_t iteration, int64_t& batch);
  bool profiling(int64_t iteration) const;
  void report_profile();
  bool profiled_rank() const;  // in --profile-ranks (default: rank 0)

  Context& ctx_;
  const train::Arguments& args_;
  Trainer& trainer_;
  RunCheckpoints& checkpoints_;
  RunStreams& streams_;
  comm::Communicator& world_;
  bool last_rank_ = false;
  std::chrono::steady_clock::time_point start_;
  size_t model_state_bytes_ = 0;  // allocated before the first step: weights, gradient buffers, optimizer state
  bool printed_memory_ = false;
  // The current log interval.
  double interval_loss_ = 0, interval_seconds_ = 0, interval_document_squares_ = 0;
  int64_t interval_iters_ = 0, skipped_ = 0, nans_ = 0;
  std::optional<double> last_grad_norm_;
  // MoE losses summed over the interval's iterations, when TensorBoard takes them every iteration.
  std::vector<std::pair<std::string, double>> interval_moe_losses_;
  std::vector<std::pair<std::string, double>> interval_moe_layer_losses_;  // --moe-per-layer-logging, TensorBoard's
  // --log-num-zeros-in-grad / --log-params-norm of the current iteration, computed once per iteration at most.
  std::optional<int64_t> num_zeros_;
  std::optional<double> params_norm_;
  std::unique_ptr<Timeline> timeline_;  // --profile with --profile-dir
  Timers timers_;             // --timing-log-level (level 2 also with --log-straggler, which reads their times)
  Timers checkpoint_timers_;  // save-checkpoint, reported after each save
  std::unique_ptr<TensorBoardLog> tensorboard_;       // the last rank with --tensorboard-dir
  std::unique_ptr<StragglerDetector> straggler_;      // --log-straggler
  std::unique_ptr<ExitSignalHandler> exit_signal_;    // --exit-signal-handler
};

}  // namespace megatron::trainer
