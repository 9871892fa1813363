// The global batch size as training goes on: Megatron's number-of-micro-batches calculators
// (megatron/core/num_microbatches_calculator.py), as a pure function of the samples consumed so far.
//
//   constant   --global-batch-size throughout.
//   ramp-up    --rampup-batch-size START INCR SAMPLES (Megatron's RampupBatchsizeNumMicroBatchesCalculator, the
//              semantics Megatron had until it replaced the flag by --step-batch-size-schedule in 2026; Megatron
//              now ignores the flag with a deprecation warning, here it keeps its meaning): with
//              n = (GBS - START) / INCR increments of SAMPLES / n samples each (a float), the batch after c
//              consumed samples is GBS when c > SAMPLES, else START + int(c / (SAMPLES / n)) * INCR.
//   step       --step-batch-size-schedule "T0:B0 T1:B1 ..." (StepBatchsizeNumMicroBatchesCalculator): entries
//              split on spaces or commas, each value an int after a K/M/B/T suffix (x 1e3 .. 1e12) is applied to
//              its float; thresholds are tokens, turned into samples by // --seq-length; sorted; the first
//              threshold must be 0, the thresholds strictly increasing, every batch positive. The batch after c
//              consumed samples is the last entry whose threshold <= c.
// Training with a schedule other than constant counts in samples (--train-samples): train_iters() is
// Megatron's update_train_iters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megatron::train {

struct Arguments;

class BatchSizeSchedule {
 public:
  static BatchSizeSchedule constant(int64_t global_batch_size);
  // Throws megatron::Error naming the flag and the violated rule (Megatron's asserts).
  static BatchSizeSchedule rampup(int64_t start, int64_t increment, int64_t rampup_samples, int64_t global_batch_size);
  static BatchSizeSchedule step(const std::string& text, int64_t seq_length);
  // The schedule the resolved arguments ask for.
  static BatchSizeSchedule from_arguments(const Arguments& args);

  // The global batch size of the iteration that starts after `consumed_samples`.
  int64_t global_batch_size(int64_t consumed_samples) const;
  // Every batch size the schedule can give (ascending, distinct): each must divide into micro-batches.
  std::vector<int64_t> sizes() const;
  // Iterations for `train_samples` (Megatron's update_train_iters: the ramp-up phase iteration by iteration,
  // then whole batches of the final size, a partial last batch thrown away; a step schedule until the samples
  // are reached).
  int64_t train_iters(int64_t train_samples) const;
  bool is_constant() const { return kind_ == Kind::Constant; }
  // (threshold in samples, batch size), for a step schedule.
  const std::vector<std::pair<int64_t, int64_t>>& steps() const { return steps_; }

 private:
  enum class Kind { Constant, Rampup, Step };
  Kind kind_ = Kind::Constant;
  int64_t final_ = 0;  // the batch after the ramp-up (constant and ramp-up)
  int64_t start_ = 0, increment_ = 0, rampup_samples_ = 0;
  double samples_per_increment_ = 0;
  std::vector<std::pair<int64_t, int64_t>> steps_;
};

}  // namespace megatron::train
