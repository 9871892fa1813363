// Loss scaling for fp16 training, Megatron-LM's grad scalers (megatron/core/optimizer/grad_scaler.py).
// The loss is multiplied by scale() before backward; the optimizer multiplies the gradients by
// inv_scale() (checking them for inf/NaN, see grad_clip.h), then calls update(found_inf) once per
// iteration. An iteration with found_inf skips the optimizer step.
//
// The scale is an fp32 value, as Megatron keeps it in a float32 tensor: growth and backoff products are
// rounded to fp32; inv_scale() is 1/scale in double rounded to fp32.
//
// DynamicLossScaler::update(found_inf), exactly Megatron's:
//   found_inf:  growth_tracker = 0; hysteresis_tracker -= 1;
//               if hysteresis_tracker <= 0: scale = max(scale * backoff_factor, min_scale)
//               (the hysteresis tracker is not reset by a backoff, so every further inf/NaN backs off again
//               until growth_interval clean iterations in a row restore it)
//   otherwise:  growth_tracker += 1;
//               if growth_tracker == growth_interval: growth_tracker = 0; hysteresis_tracker = hysteresis;
//                                                     scale = scale * growth_factor
#pragma once

#include <cstdint>
#include <memory>

#include "megatron/train/arguments.h"

namespace megatron::optim {

// What a checkpoint stores (Megatron's state_dict: scale, growth_tracker, hysteresis_tracker).
struct LossScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class LossScaler {
 public:
  virtual ~LossScaler() = default;
  float scale() const { return scale_; }
  float inv_scale() const { return float(1.0 / double(scale_)); }
  virtual void update(bool found_inf) = 0;
  virtual LossScalerState state() const = 0;
  virtual void load_state(const LossScalerState& state) = 0;

 protected:
  explicit LossScaler(float initial_scale);
  float scale_;
};

// Never changes its scale (--loss-scale S).
class ConstantLossScaler final : public LossScaler {
 public:
  explicit ConstantLossScaler(float scale) : LossScaler(scale) {}
  void update(bool) override {}
  LossScalerState state() const override { return {scale_, 0, 0}; }
  void load_state(const LossScalerState&) override {}  // Megatron's constant scaler keeps its own scale
};

struct DynamicLossScalerConfig {
  float initial_scale = 4294967296.0f;  // 2^32 (--initial-loss-scale)
  float min_scale = 1.0f;               // --min-loss-scale
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 1000;       // --loss-scale-window
  int64_t hysteresis = 2;               // --hysteresis
};

class DynamicLossScaler final : public LossScaler {
 public:
  // Throws megatron::Error unless 0 < min_scale <= initial_scale, growth_factor > 1,
  // 0 < backoff_factor < 1, growth_interval > 0, hysteresis > 0.
  explicit DynamicLossScaler(const DynamicLossScalerConfig& config = {});
  void update(bool found_inf) override;
  LossScalerState state() const override { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void load_state(const LossScalerState& state) override;

  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  const DynamicLossScalerConfig& config() const { return config_; }

 private:
  DynamicLossScalerConfig config_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

// Megatron's choice: --loss-scale S (fp16 or bf16) gives a ConstantLossScaler(S); fp16 without it a
// DynamicLossScaler from --initial-loss-scale and the defaults above; otherwise none (nullptr: bf16 and
// fp32 train unscaled).
std::unique_ptr<LossScaler> make_loss_scaler(const train::TrainingArguments& args);

}  // namespace megatron::optim
