#include "megatron/train/log_line.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace megatron::train {
namespace {

std::string now_timestamp() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// printf into a std::string.
template <class... Args>
std::string fmt(const char* format, Args... args) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, format, args...);
  return std::string(buf, n > 0 ? size_t(n) : 0);
}

}  // namespace

std::string format_moe_per_layer(const std::vector<std::pair<std::string, double>>& per_layer) {
  std::vector<std::pair<std::string, std::vector<double>>> losses;  // in the order they first appear
  for (const auto& [name, value] : per_layer) {
    const size_t at = name.rfind("_layer_");
    const size_t from = name.starts_with("moe/") ? 4 : 0;
    const std::string loss = name.substr(from, at == std::string::npos ? std::string::npos : at - from);
    if (losses.empty() || losses.back().first != loss) losses.emplace_back(loss, std::vector<double>{});
    losses.back().second.push_back(value);
  }
  std::string s;
  for (const auto& [loss, values] : losses) {
    s += fmt("  per-layer %s (layers 0-%zu):", loss.c_str(), values.size() - 1);
    for (double v : values) s += fmt(" %E", v);
    s += "\n";
  }
  return s;
}

std::string format_log_line(const IterationLog& l) {
  std::string s = " [" + (l.timestamp.empty() ? now_timestamp() : l.timestamp) + "]";
  s += fmt(" iteration %8lld/%8lld |", (long long)l.iteration, (long long)l.train_iters);
  s += fmt(" consumed samples: %12lld |", (long long)l.consumed_samples);
  s += fmt(" elapsed time per iteration (ms): %.1f |", l.seconds_per_iteration * 1000.0);
  if (l.tflops_per_gpu) s += fmt(" throughput per GPU (TFLOP/s/GPU): %.1f |", *l.tflops_per_gpu);
  if (l.tokens_per_second_per_gpu) s += fmt(" tokens per second per GPU: %.0f |", *l.tokens_per_second_per_gpu);
  s += fmt(" learning rate: %.6E |", l.learning_rate);
  s += fmt(" global batch size: %5lld |", (long long)l.global_batch_size);
  s += fmt(" lm loss: %.6E |", l.lm_loss);
  for (const auto& [name, value] : l.extra_losses) s += " " + name + fmt(": %.6E |", value);
  s += fmt(" loss scale: %.1f |", l.loss_scale);
  if (l.grad_norm) s += fmt(" grad norm: %.3f |", *l.grad_norm);
  if (l.num_zeros) s += fmt(" num zeros: %.1f |", double(*l.num_zeros));  // Megatron prints the count as a float
  if (l.params_norm) s += fmt(" params norm: %.3f |", *l.params_norm);
  s += fmt(" number of skipped iterations: %3lld |", (long long)l.skipped_iterations);
  s += fmt(" number of nan iterations: %3lld |", (long long)l.nan_iterations);
  return s;
}

}  // namespace megatron::train
