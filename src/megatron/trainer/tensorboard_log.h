// TensorBoardLog: the scalars Megatron's training_log and evaluate_and_print_results write to TensorBoard
// (megatron/training/training.py), under Megatron's tags, into --tensorboard-dir on the last rank:
//   every --tensorboard-log-interval iterations: learning-rate, batch-size, lm loss (the iteration's), loss-scale
//     (unless --no-log-loss-scale-to-tensorboard), grad-norm (when computed), num-zeros (--log-num-zeros-in-grad),
//     params-norm (--log-params-norm), world-size (--log-world-size-to-tensorboard), each also as
//     "<tag> vs samples" over the consumed samples; mem-reserved-bytes, mem-allocated-bytes and
//     mem-max-allocated-bytes (--log-memory-to-tensorboard);
//   every iteration of an MoE model: each router loss averaged over the MoE layers (load_balancing_loss,
//     z_loss, ...) and, with --moe-per-layer-logging, moe/<loss>_layer_<i> for every layer i;
//   every --log-interval (--log-timers-to-tensorboard): iteration-time (s), throughput (TFLOP/s per GPU, with
//     --log-throughput) and <timer>-time for the timers of --timing-log-level (max over ranks, s per iteration);
//   at each evaluation: "lm loss validation" (and "lm loss validation ppl" with
//     --log-validation-ppl-to-tensorboard), also "vs samples";
//   ours, with --log-straggler: straggler/min-throughput and straggler/max-throughput (TFLOP/s per rank) and the
//     ranks they belong to (straggler/min-throughput-rank, straggler/max-throughput-rank).
// Megatron's mem-allocated-count (live allocations) is not written: the allocator does not count them.
// open() returns null where nothing is written (no --tensorboard-dir, or not the last rank).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/tensor/allocator.h"
#include "megatron/train/arguments.h"

namespace megatron::trainer {

struct IterationScalars {
  int64_t iteration = 0, consumed_samples = 0, batch_size = 0;
  double learning_rate = 0, lm_loss = 0, loss_scale = 1;
  std::optional<double> grad_norm, params_norm;
  std::optional<int64_t> num_zeros;
  std::optional<AllocatorStats> memory;
};

class TensorBoardLog {
 public:
  static std::unique_ptr<TensorBoardLog> open(const train::Arguments& args, bool last_rank);
  ~TensorBoardLog();

  // The per-iteration scalars (the caller keeps --tensorboard-log-interval).
  void iteration(const IterationScalars& s);
  // MoE router losses of one iteration: averaged over the MoE layers, and per layer (empty without
  // --moe-per-layer-logging).
  void moe_losses(int64_t iteration, const std::vector<std::pair<std::string, double>>& averaged,
                  const std::vector<std::pair<std::string, double>>& per_layer);
  // Every --log-interval: the interval's time per iteration, its throughput and the timers.
  void interval(int64_t iteration, double seconds_per_iteration, std::optional<double> tflops_per_gpu,
                const std::vector<std::pair<std::string, double>>& timer_max_seconds);
  void validation(int64_t iteration, int64_t consumed_samples, double loss);
  void straggler(int64_t iteration, double slowest_tflops, int slowest_rank, double fastest_tflops, int fastest_rank);
  // Makes everything written so far visible to a reader (after each log line).
  void flush();
  std::string path() const;

 private:
  struct Writer;
  TensorBoardLog(const train::Arguments& args, std::unique_ptr<Writer> writer);
  void scalar(const std::string& tag, double value, int64_t step);

  const train::Arguments& args_;
  std::unique_ptr<Writer> writer_;
};

}  // namespace megatron::trainer
