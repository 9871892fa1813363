// Megatron's per-iteration log line (megatron/training/training.py, training_log), character for character,
// so scripts that parse Megatron logs read ours:
//  [2026-11-22 10:00:00] iteration      100/    1000 | consumed samples:         6400 | elapsed time per
//  iteration (ms): 512.3 | throughput per GPU (TFLOP/s/GPU): 401.2 | tokens per second per GPU: 123456 |
//  learning rate: 3.000000E-04 | global batch size:    64 | lm loss: 5.123456E+00 | loss scale: 1.0 |
//  grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |
// (one line). "tokens per second per GPU" is ours; Megatron users asked for it and parsers skip unknown keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megatron::train {

struct IterationLog {
  std::string timestamp;  // "2026-11-22 10:00:00"; empty = now (local time)
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double seconds_per_iteration = 0;
  std::optional<double> tflops_per_gpu;
  std::optional<double> tokens_per_second_per_gpu;
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  // Further losses printed after lm loss in the same format (MoE: load_balancing_loss, z_loss, ...; each the
  // mean over the MoE layers, as Megatron's track_moe_metrics adds them to its loss dictionary).
  std::vector<std::pair<std::string, double>> extra_losses;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;  // absent when the iteration was skipped
  std::optional<int64_t> num_zeros;     // --log-num-zeros-in-grad
  std::optional<double> params_norm;    // --log-params-norm
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

std::string format_log_line(const IterationLog& log);

// --moe-per-layer-logging's values, named "moe/<loss>_layer_<i>" (Trainer::moe_losses), as text: one line per
// loss, "  per-layer <loss> (layers 0-<n-1>): <v0> <v1> ..." in the log line's number format, in the order given.
// Megatron writes them only to TensorBoard and W&B; the log carries them too, so a run's balance per layer can be
// read from its log alone. Empty for no values.
std::string format_moe_per_layer(const std::vector<std::pair<std::string, double>>& per_layer);

}  // namespace megatron::train
