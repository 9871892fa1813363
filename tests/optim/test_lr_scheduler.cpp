// Megatron's learning-rate schedule: every decay style against closed forms written out here (phase by
// phase, independently of the implementation), the edge cases (step 0, warmup 0, warmup end == max_lr,
// decay end == min_lr, constant after the decay), WSD's three phases for each anneal shape, the weight
// decay schedule, construction from Megatron's flags and the rejected configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "harness.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/train/flags.h"

namespace megatron::optim {
namespace {

using ::megatron::testing::expect_error;

constexpr double kPi = std::numbers::pi;

ParamSchedule make(LrDecayStyle style, int64_t warmup, int64_t decay, double max_lr = 3e-4, double min_lr = 3e-5) {
  ParamSchedule s;
  s.max_lr = max_lr;
  s.min_lr = min_lr;
  s.warmup_steps = warmup;
  s.decay_steps = decay;
  s.decay_style = style;
  return s;
}

double lr_at(const ParamSchedule& s, int64_t n) {
  OptimizerParamScheduler sched(s);
  sched.step(n);
  return sched.lr();
}

// The schedule written phase by phase, from the description of Megatron's scheduler.
double reference_lr(const ParamSchedule& s, int64_t n) {
  const double hi = s.max_lr, lo = s.min_lr;
  const double W = double(s.warmup_steps), D = double(s.decay_steps), x = double(n);
  if (s.warmup_steps > 0 && x <= W) return s.init_lr + (hi - s.init_lr) * (x / W);
  if (s.decay_style == LrDecayStyle::Constant) return hi;
  if (x > D) return lo;
  if (s.decay_style == LrDecayStyle::InverseSquareRoot) {
    double v = hi * std::sqrt(std::max(W, 1.0) / std::max(x, 1.0));
    return v < lo ? lo : v;
  }
  const double t = (x - W) / (D - W);  // fraction of the decay phase done
  if (s.decay_style == LrDecayStyle::Linear) return lo + (hi - lo) * (1 - t);
  if (s.decay_style == LrDecayStyle::Cosine) return lo + (hi - lo) * (1 + std::cos(kPi * t)) / 2;
  // WSD
  const double A = double(s.wsd_decay_steps), start = D - A;
  if (x <= start) return hi;
  const double q = (x - start) / A;
  double f = 0;
  switch (s.wsd_decay_style) {
    case WsdDecayStyle::Linear: f = 1 - q; break;
    case WsdDecayStyle::Cosine: f = (1 + std::cos(kPi * q)) / 2; break;
    case WsdDecayStyle::Exponential: f = 2 * std::exp2(-q) - 1; break;
    case WsdDecayStyle::MinusSqrt: f = 1 - std::sqrt(q); break;
  }
  return lo + (hi - lo) * f;
}

void expect_matches_reference_everywhere(const ParamSchedule& s) {
  OptimizerParamScheduler sched(s);
  for (int64_t n = 0; n <= s.decay_steps + 20; ++n) {
    ASSERT_NEAR(sched.lr(), reference_lr(s, n), 1e-15) << "step " << n;
    sched.step();
  }
}

// Nondecreasing through the warmup, nonincreasing afterwards.
void expect_warmup_then_decay_monotone(const ParamSchedule& s) {
  double prev = lr_at(s, 0);
  for (int64_t n = 1; n <= s.decay_steps + 5; ++n) {
    const double v = lr_at(s, n);
    if (n <= s.warmup_steps) EXPECT_GE(v, prev) << "step " << n;
    else EXPECT_LE(v, prev + 1e-18) << "step " << n;
    prev = v;
  }
}

TEST(LrSchedule, LinearClosedForms) {
  ParamSchedule s = make(LrDecayStyle::Linear, 10, 110, 1e-3, 1e-4);
  EXPECT_EQ(lr_at(s, 0), 0.0);  // Megatron's first step at init_lr 0
  EXPECT_NEAR(lr_at(s, 5), 5e-4, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 1e-3);                // warmup end == max_lr
  EXPECT_NEAR(lr_at(s, 60), 1e-4 + 0.5 * 9e-4, 1e-18);  // halfway through the decay
  EXPECT_NEAR(lr_at(s, 85), 1e-4 + 0.25 * 9e-4, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 1e-4);                // decay end == min_lr
  EXPECT_DOUBLE_EQ(lr_at(s, 111), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 100000), 1e-4);
  expect_matches_reference_everywhere(s);
  expect_warmup_then_decay_monotone(s);
}

TEST(LrSchedule, CosineClosedForms) {
  ParamSchedule s = make(LrDecayStyle::Cosine, 20, 220, 6e-4, 6e-5);
  EXPECT_DOUBLE_EQ(lr_at(s, 20), 6e-4);
  EXPECT_NEAR(lr_at(s, 120), (6e-4 + 6e-5) / 2, 1e-18);
  EXPECT_NEAR(lr_at(s, 70), 6e-5 + 5.4e-4 * (1 + std::sqrt(0.5)) / 2, 1e-18);  // a quarter: cos(pi/4)
  EXPECT_NEAR(lr_at(s, 220), 6e-5, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at(s, 221), 6e-5);
  expect_matches_reference_everywhere(s);
  expect_warmup_then_decay_monotone(s);
}

TEST(LrSchedule, ConstantIsMaxAfterWarmupEvenPastTheDecay) {
  ParamSchedule s = make(LrDecayStyle::Constant, 4, 8, 2e-4, 1e-5);
  EXPECT_EQ(lr_at(s, 0), 0.0);
  EXPECT_NEAR(lr_at(s, 1), 0.5e-4, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 8), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 1000), 2e-4);
  expect_matches_reference_everywhere(s);
}

TEST(LrSchedule, InverseSquareRoot) {
  ParamSchedule s = make(LrDecayStyle::InverseSquareRoot, 16, 2000, 1e-3, 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 16), 1e-3);
  EXPECT_NEAR(lr_at(s, 64), 1e-3 / 2, 1e-18);   // sqrt(16/64)
  EXPECT_NEAR(lr_at(s, 144), 1e-3 / 3, 1e-18);  // sqrt(16/144)
  EXPECT_NEAR(lr_at(s, 999), 1e-3 * std::sqrt(16.0 / 999), 1e-18);
  EXPECT_NEAR(lr_at(s, 1600), 1e-4, 1e-18);     // sqrt(16/1600) = 0.1: reaches min_lr
  EXPECT_DOUBLE_EQ(lr_at(s, 1800), 1e-4);       // held at the floor (the formula gives less)
  EXPECT_DOUBLE_EQ(lr_at(s, 2001), 1e-4);       // past the decay
  expect_matches_reference_everywhere(s);
  expect_warmup_then_decay_monotone(s);
  // warmup 0: max(warmup, 1) = 1 and max(n, 1) = 1 give max_lr at steps 0 and 1.
  ParamSchedule z = make(LrDecayStyle::InverseSquareRoot, 0, 100, 1e-3, 0);
  EXPECT_DOUBLE_EQ(lr_at(z, 0), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(z, 1), 1e-3);
  EXPECT_NEAR(lr_at(z, 4), 5e-4, 1e-18);
}

TEST(LrSchedule, NoWarmupStartsTheDecayAtStepZero) {
  for (LrDecayStyle style : {LrDecayStyle::Linear, LrDecayStyle::Cosine, LrDecayStyle::Constant}) {
    ParamSchedule s = make(style, 0, 50, 1e-3, 1e-5);
    EXPECT_DOUBLE_EQ(lr_at(s, 0), 1e-3);
    expect_matches_reference_everywhere(s);
  }
  EXPECT_NEAR(lr_at(make(LrDecayStyle::Linear, 0, 50, 1e-3, 0), 10), 0.8e-3, 1e-18);
}

TEST(LrSchedule, WarmupFromANonzeroInitLr) {
  ParamSchedule s = make(LrDecayStyle::Linear, 10, 20, 1e-3, 0);
  s.init_lr = 1e-4;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 1e-4);
  EXPECT_NEAR(lr_at(s, 5), 1e-4 + 0.5 * 9e-4, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 1e-3);
}

TEST(LrSchedule, PerGroupMaxAndMinLr) {
  OptimizerParamScheduler sched(make(LrDecayStyle::Linear, 10, 110, 1e-3, 1e-4));
  sched.step(60);
  EXPECT_NEAR(sched.lr(2e-3, 0.0), 1e-3, 1e-18);
  sched.step(1);
  EXPECT_EQ(sched.num_steps(), 61);
  sched.set_num_steps(5);
  EXPECT_NEAR(sched.lr(2e-3, 0.0), 1e-3, 1e-18);  // warmup toward the group's max
}

class WsdStyles : public ::testing::TestWithParam<WsdDecayStyle> {};

TEST_P(WsdStyles, ThreePhases) {
  ParamSchedule s = make(LrDecayStyle::WSD, 10, 110, 1e-3, 1e-4);
  s.wsd_decay_steps = 20;  // anneal over steps (90, 110]
  s.wsd_decay_style = GetParam();
  EXPECT_NEAR(lr_at(s, 5), 5e-4, 1e-18);
  for (int64_t n : {10, 11, 50, 89, 90}) EXPECT_DOUBLE_EQ(lr_at(s, n), 1e-3) << "stable at " << n;
  double mid = 0;  // anneal fraction 1/2
  switch (GetParam()) {
    case WsdDecayStyle::Exponential: mid = std::sqrt(2.0) - 1; break;
    case WsdDecayStyle::Linear: mid = 0.5; break;
    case WsdDecayStyle::Cosine: mid = 0.5; break;
    case WsdDecayStyle::MinusSqrt: mid = 1 - std::sqrt(0.5); break;
  }
  EXPECT_NEAR(lr_at(s, 100), 1e-4 + 9e-4 * mid, 1e-17);
  EXPECT_NEAR(lr_at(s, 110), 1e-4, 1e-18);  // decay end == min_lr for every anneal shape
  EXPECT_DOUBLE_EQ(lr_at(s, 111), 1e-4);
  EXPECT_LT(lr_at(s, 91), 1e-3);
  expect_matches_reference_everywhere(s);
  expect_warmup_then_decay_monotone(s);
}

INSTANTIATE_TEST_SUITE_P(Optim, WsdStyles,
                         ::testing::Values(WsdDecayStyle::Exponential, WsdDecayStyle::Linear, WsdDecayStyle::Cosine,
                                           WsdDecayStyle::MinusSqrt),
                         [](const auto& info) { return std::to_string(int(info.param)); });

TEST(LrSchedule, WsdWithNoAnnealStepsDropsToMinLrAfterTheDecay) {
  ParamSchedule s = make(LrDecayStyle::WSD, 0, 10, 1e-3, 1e-4);
  s.wsd_decay_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(s, 11), 1e-4);
}

TEST(WeightDecaySchedule, ConstantLinearCosine) {
  ParamSchedule s = make(LrDecayStyle::Linear, 0, 10);
  s.start_wd = s.end_wd = 0.1;
  OptimizerParamScheduler constant(s);
  EXPECT_DOUBLE_EQ(constant.weight_decay(), 0.1);
  constant.step(1000);
  EXPECT_DOUBLE_EQ(constant.weight_decay(), 0.1);

  s.start_wd = 0.0;
  s.end_wd = 0.1;
  s.wd_incr_steps = 100;
  s.wd_incr_style = WdIncrStyle::Linear;
  OptimizerParamScheduler linear(s);
  EXPECT_DOUBLE_EQ(linear.weight_decay(), 0.0);
  linear.step(25);
  EXPECT_NEAR(linear.weight_decay(), 0.025, 1e-17);
  linear.step(75);
  EXPECT_NEAR(linear.weight_decay(), 0.1, 1e-17);
  linear.step(1);
  EXPECT_DOUBLE_EQ(linear.weight_decay(), 0.1);

  s.wd_incr_style = WdIncrStyle::Cosine;
  OptimizerParamScheduler cosine(s);
  cosine.step(50);
  EXPECT_NEAR(cosine.weight_decay(), 0.05, 1e-17);
  cosine.step(25);
  EXPECT_NEAR(cosine.weight_decay(), 0.1 * (1 + std::cos(kPi * 0.25)) / 2, 1e-17);
}

TEST(LrSchedule, RejectsWhatMegatronAsserts) {
  expect_error([] { OptimizerParamScheduler(make(LrDecayStyle::Linear, 10, 10)); }, {"warmup steps 10", "decay steps 10"});
  expect_error([] { OptimizerParamScheduler(make(LrDecayStyle::Linear, 0, 0)); }, {"decay steps 0"});
  expect_error([] { OptimizerParamScheduler(make(LrDecayStyle::Linear, 0, 10, 1e-4, 1e-3)); }, {"max_lr", "min_lr"});
  expect_error([] { OptimizerParamScheduler(make(LrDecayStyle::Linear, 0, 10, 1e-4, -1)); }, {"min_lr -1"});
  ParamSchedule s = make(LrDecayStyle::Linear, 0, 10);
  s.start_wd = 0.0;
  s.end_wd = 0.1;
  expect_error([&] { OptimizerParamScheduler{s}; }, {"constant weight decay"});
  expect_error([] { parse_lr_decay_style("cosin"); }, {"'cosin'", "inverse-square-root"});
  expect_error([] { parse_wsd_decay_style("1-sqrt"); }, {"'1-sqrt'", "minus_sqrt"});
}

TEST(LrSchedule, FromMegatronFlags) {
  const std::vector<std::string> common = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                           "--seq-length", "32", "--mock-data", "--vocab-size", "4096",
                                           "--train-iters", "1000", "--lr", "3e-4", "--min-lr", "3e-5",
                                           "--lr-warmup-iters", "100", "--weight-decay", "0.1"};
  std::vector<std::string> argv = common;
  argv.insert(argv.end(), {"--lr-decay-style", "WSD", "--lr-wsd-decay-style", "minus_sqrt", "--lr-wsd-decay-iters", "200"});
  train::Arguments a = train::parse_arguments(argv);
  train::resolve_and_validate(a);
  const ParamSchedule s = schedule_from_arguments(a.training);
  EXPECT_EQ(s.init_lr, 0.0);
  EXPECT_DOUBLE_EQ(s.max_lr, 3e-4);
  EXPECT_DOUBLE_EQ(s.min_lr, 3e-5);
  EXPECT_EQ(s.warmup_steps, 100);
  EXPECT_EQ(s.decay_steps, 1000);  // --lr-decay-iters defaults to --train-iters
  EXPECT_EQ(s.decay_style, LrDecayStyle::WSD);
  EXPECT_EQ(s.wsd_decay_steps, 200);
  EXPECT_EQ(s.wsd_decay_style, WsdDecayStyle::MinusSqrt);
  EXPECT_DOUBLE_EQ(s.start_wd, 0.1);
  EXPECT_DOUBLE_EQ(s.end_wd, 0.1);
  OptimizerParamScheduler sched(s);
  sched.step(900);
  EXPECT_NEAR(sched.lr(), 3e-4 - 2.7e-4 * std::sqrt(0.5), 1e-17);

  // Defaults: exponential anneal; WSD without --lr-wsd-decay-iters is a constraint violation.
  argv = common;
  argv.insert(argv.end(), {"--lr-decay-style", "WSD"});
  a = train::parse_arguments(argv);
  EXPECT_EQ(a.training.lr_wsd_decay_style, "exponential");
  expect_error([&] { train::resolve_and_validate(a); }, {"--lr-wsd-decay-iters"});
  expect_error([] { train::parse_arguments({"--lr-wsd-decay-style", "sqrt"}); }, {"--lr-wsd-decay-style", "minus_sqrt"});
}

}  // namespace
}  // namespace megatron::optim
