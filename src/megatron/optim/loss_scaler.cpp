#include "megatron/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/error.h"

namespace megatron::optim {

LossScaler::LossScaler(float initial_scale) : scale_(initial_scale) {
  MEGATRON_CHECK(std::isfinite(initial_scale) && initial_scale > 0.0f, "loss scale ", initial_scale,
                 " must be positive and finite");
}

DynamicLossScaler::DynamicLossScaler(const DynamicLossScalerConfig& config)
    : LossScaler(config.initial_scale), config_(config), hysteresis_tracker_(config.hysteresis) {
  MEGATRON_CHECK(config.min_scale > 0.0f && config.min_scale <= config.initial_scale, "DynamicLossScaler: min scale ",
                 config.min_scale, " must be in (0, initial scale ", config.initial_scale, "]");
  MEGATRON_CHECK(config.growth_factor > 1.0f, "DynamicLossScaler: growth factor ", config.growth_factor,
                 " must be > 1");
  MEGATRON_CHECK(config.backoff_factor > 0.0f && config.backoff_factor < 1.0f, "DynamicLossScaler: backoff factor ",
                 config.backoff_factor, " must be in (0, 1)");
  MEGATRON_CHECK(config.growth_interval > 0, "DynamicLossScaler: growth interval ", config.growth_interval,
                 " must be positive");
  MEGATRON_CHECK(config.hysteresis > 0, "DynamicLossScaler: hysteresis ", config.hysteresis, " must be positive");
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
  } else {
    growth_tracker_ += 1;
    if (growth_tracker_ == config_.growth_interval) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = config_.hysteresis;
      scale_ = scale_ * config_.growth_factor;
    }
  }
}

void DynamicLossScaler::load_state(const LossScalerState& state) {
  MEGATRON_CHECK(std::isfinite(state.scale) && state.scale > 0.0f, "DynamicLossScaler::load_state: scale ",
                 state.scale, " must be positive and finite");
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
}

std::unique_ptr<LossScaler> make_loss_scaler(const train::TrainingArguments& args) {
  if (!args.fp16 && !args.bf16) return nullptr;
  if (args.loss_scale > 0) return std::make_unique<ConstantLossScaler>(float(args.loss_scale));
  if (!args.fp16) return nullptr;
  DynamicLossScalerConfig config;
  config.initial_scale = float(args.initial_loss_scale);
  return std::make_unique<DynamicLossScaler>(config);
}

}  // namespace megatron::optim
