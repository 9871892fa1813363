// TrainLoop: the iterations of a run after its setup (pretrain.h), Megatron's train() loop:
//   for iteration = start + 1 .. --train-iters:
//     Trainer::train_step;
//     every --log-interval (and at the last iteration): Megatron's log line on the last rank, averaged over
//       the interval (loss, time per iteration, TFLOP/s and tokens/s per GPU), and once, each GPU rank's
//       peak memory next to the model state allocated before the first step;
//     every --eval-interval: the validation loss and perplexity (last rank);
//     publish a finished asynchronous save; save every --save-interval;
//     stop at --exit-interval, or once --exit-duration-in-mins has passed on any rank (agreed over the world,
//     so every rank stops at the same iteration);
//   then save the last iteration (Megatron saves when a run stops), wait for an asynchronous save in flight,
//   and evaluate on the test split.
// Profiling (--profile): iterations [--profile-step-start, --profile-step-end) are marked for an external
// profiler (cudaProfilerStart/Stop, NVTX ranges); with --profile-dir every rank also records its timeline over
// them, the ranks of --profile-ranks (default 0) write it as a Chrome trace (trace_rank_<r>.json, merged by
// rank 0 into trace.json), and rank 0 reports each pipeline stage's measured bubble -- idle time over compute
// time in the schedule -- next to the ideal (p - 1) / (v * m).
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "megatron/trainer/run_checkpoints.h"
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
  // Accumulates one iteration into the interval and prints the log line when the interval is complete.
  void log(int64_t iteration, const StepResult& r, double seconds);
  void print_memory_once(int64_t iteration);
  void print_evaluation(const std::string& where, double loss) const;
  bool should_exit(int64_t iteration);
  // Saves iteration - 1 when the global batch of `iteration` differs from `batch` (then updated).
  void save_when_batch_grows(int64_t iteration, int64_t& batch);
  bool profiling(int64_t iteration) const;
  void report_profile();

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
  double interval_loss_ = 0, interval_seconds_ = 0;
  int64_t interval_iters_ = 0, skipped_ = 0, nans_ = 0;
  std::optional<double> last_grad_norm_;
  std::unique_ptr<Timeline> timeline_;  // --profile with --profile-dir
};

}  // namespace megatron::trainer
