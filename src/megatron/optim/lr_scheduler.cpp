#include "megatron/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "megatron/core/error.h"

namespace megatron::optim {

LrDecayStyle parse_lr_decay_style(std::string_view name) {
  if (name == "constant") return LrDecayStyle::Constant;
  if (name == "linear") return LrDecayStyle::Linear;
  if (name == "cosine") return LrDecayStyle::Cosine;
  if (name == "inverse-square-root") return LrDecayStyle::InverseSquareRoot;
  if (name == "WSD") return LrDecayStyle::WSD;
  MEGATRON_FAIL("lr decay style '", name, "' is not one of constant, linear, cosine, inverse-square-root, WSD");
}

WsdDecayStyle parse_wsd_decay_style(std::string_view name) {
  if (name == "exponential") return WsdDecayStyle::Exponential;
  if (name == "linear") return WsdDecayStyle::Linear;
  if (name == "cosine") return WsdDecayStyle::Cosine;
  if (name == "minus_sqrt") return WsdDecayStyle::MinusSqrt;
  MEGATRON_FAIL("WSD decay style '", name, "' is not one of exponential, linear, cosine, minus_sqrt");
}

WdIncrStyle parse_wd_incr_style(std::string_view name) {
  if (name == "constant") return WdIncrStyle::Constant;
  if (name == "linear") return WdIncrStyle::Linear;
  if (name == "cosine") return WdIncrStyle::Cosine;
  MEGATRON_FAIL("weight decay increment style '", name, "' is not one of constant, linear, cosine");
}

ParamSchedule schedule_from_arguments(const train::TrainingArguments& args) {
  ParamSchedule s;
  const int64_t gbs = args.global_batch_size;
  const bool samples = args.iterations_from_samples;
  s.init_lr = args.lr_warmup_init;
  s.max_lr = args.lr;
  s.min_lr = args.min_lr;
  s.decay_steps = samples ? (args.lr_decay_samples > 0 ? args.lr_decay_samples : args.train_samples)
                          : (args.lr_decay_iters > 0 ? args.lr_decay_iters : args.train_iters) * gbs;
  s.warmup_steps = args.lr_warmup_fraction >= 0 ? args.lr_warmup_fraction * double(s.decay_steps)
                   : samples                    ? double(args.lr_warmup_samples)
                                                : double(args.lr_warmup_iters * gbs);
  s.decay_style = parse_lr_decay_style(args.lr_decay_style);
  s.wsd_decay_steps = samples ? args.lr_wsd_decay_samples : args.lr_wsd_decay_iters * gbs;
  s.wsd_decay_style = parse_wsd_decay_style(args.lr_wsd_decay_style);
  s.wd_incr_style = parse_wd_incr_style(args.weight_decay_incr_style);
  const bool constant_wd = s.wd_incr_style == WdIncrStyle::Constant;
  s.start_wd = constant_wd ? args.weight_decay : args.start_weight_decay;
  s.end_wd = constant_wd ? args.weight_decay : args.end_weight_decay;
  s.wd_incr_steps = samples ? args.train_samples : args.train_iters * gbs;
  return s;
}

OptimizerParamScheduler::OptimizerParamScheduler(const ParamSchedule& s) : schedule_(s) {
  MEGATRON_CHECK(s.min_lr >= 0.0, "OptimizerParamScheduler: min_lr ", s.min_lr, " must be >= 0");
  MEGATRON_CHECK(s.max_lr >= s.min_lr, "OptimizerParamScheduler: max_lr ", s.max_lr, " must be >= min_lr ", s.min_lr);
  MEGATRON_CHECK(s.init_lr <= s.max_lr, "OptimizerParamScheduler: init_lr ", s.init_lr, " must be <= max_lr ", s.max_lr);
  MEGATRON_CHECK(s.decay_steps > 0, "OptimizerParamScheduler: decay steps ", s.decay_steps, " must be positive");
  MEGATRON_CHECK(s.warmup_steps >= 0 && s.warmup_steps < double(s.decay_steps), "OptimizerParamScheduler: warmup steps ",
                 s.warmup_steps, " must be in [0, decay steps ", s.decay_steps, ")");
  if (s.decay_style == LrDecayStyle::WSD)
    MEGATRON_CHECK(s.wsd_decay_steps >= 0, "OptimizerParamScheduler: WSD decay steps ", s.wsd_decay_steps,
                   " must be >= 0");
  MEGATRON_CHECK(s.start_wd >= 0.0, "OptimizerParamScheduler: start weight decay ", s.start_wd, " must be >= 0");
  MEGATRON_CHECK(s.end_wd >= s.start_wd, "OptimizerParamScheduler: end weight decay ", s.end_wd,
                 " must be >= start weight decay ", s.start_wd);
  if (s.wd_incr_style == WdIncrStyle::Constant)
    MEGATRON_CHECK(s.start_wd == s.end_wd, "OptimizerParamScheduler: constant weight decay needs start ", s.start_wd,
                   " == end ", s.end_wd);
  else
    MEGATRON_CHECK(s.wd_incr_steps > 0, "OptimizerParamScheduler: weight decay increment steps ", s.wd_incr_steps,
                   " must be positive");
}

double OptimizerParamScheduler::lr(double max_lr, double min_lr) const {
  const ParamSchedule& s = schedule_;
  const int64_t n = num_steps_;
  if (s.warmup_steps > 0 && double(n) <= s.warmup_steps) return s.init_lr + (max_lr - s.init_lr) * double(n) / s.warmup_steps;
  if (s.decay_style == LrDecayStyle::Constant) return max_lr;
  if (n > s.decay_steps) return min_lr;
  if (s.decay_style == LrDecayStyle::InverseSquareRoot) {
    const double warmup = std::max(s.warmup_steps, 1.0);
    const double steps = double(std::max<int64_t>(n, 1));
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
  }
  const double ratio = (double(n) - s.warmup_steps) / (double(s.decay_steps) - s.warmup_steps);
  double coeff = 1.0;
  switch (s.decay_style) {
    case LrDecayStyle::Linear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::Cosine: coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0); break;
    case LrDecayStyle::WSD: {
      const int64_t anneal_start = s.decay_steps - s.wsd_decay_steps;
      if (n <= anneal_start) break;  // the stable phase: coeff 1
      const double q = double(n - anneal_start) / double(s.wsd_decay_steps);
      switch (s.wsd_decay_style) {
        case WsdDecayStyle::Linear: coeff = 1.0 - q; break;
        case WsdDecayStyle::Cosine: coeff = 0.5 * (std::cos(std::numbers::pi * q) + 1.0); break;
        case WsdDecayStyle::Exponential: coeff = 2.0 * std::pow(0.5, q) - 1.0; break;
        case WsdDecayStyle::MinusSqrt: coeff = 1.0 - std::sqrt(q); break;
      }
      break;
    }
    case LrDecayStyle::Constant:
    case LrDecayStyle::InverseSquareRoot: break;  // handled above
  }
  return min_lr + coeff * (max_lr - min_lr);
}

double OptimizerParamScheduler::weight_decay() const {
  const ParamSchedule& s = schedule_;
  if (num_steps_ > s.wd_incr_steps) return s.end_wd;
  if (s.wd_incr_style == WdIncrStyle::Constant) return s.end_wd;
  const double ratio = double(num_steps_) / double(s.wd_incr_steps);
  const double coeff =
      s.wd_incr_style == WdIncrStyle::Linear ? ratio : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
  return s.start_wd + coeff * (s.end_wd - s.start_wd);
}

void OptimizerParamScheduler::step(int64_t increment) {
  MEGATRON_CHECK(increment >= 0, "OptimizerParamScheduler::step: increment ", increment, " must be >= 0");
  num_steps_ += increment;
}

void OptimizerParamScheduler::set_num_steps(int64_t n) {
  MEGATRON_CHECK(n >= 0, "OptimizerParamScheduler::set_num_steps: ", n, " must be >= 0");
  num_steps_ = n;
}

}  // namespace megatron::optim
