// Loss scalers against a hand-simulated reference of Megatron's DynamicGradScaler: growth after the
// interval, backoff only once the hysteresis is used up (and again on every further overflow), the
// minimum scale, fp32 rounding of the scale, state round trips, and Megatron's choice of scaler by flags.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness.h"
#include "megatron/optim/loss_scaler.h"

namespace megatron::optim {
namespace {

using ::megatron::testing::expect_error;

TEST(LossScaler, MegatronDefaults) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 4294967296.0f);
  EXPECT_EQ(s.inv_scale(), float(1.0 / 4294967296.0));
  EXPECT_EQ(s.config().min_scale, 1.0f);
  EXPECT_EQ(s.config().growth_factor, 2.0f);
  EXPECT_EQ(s.config().backoff_factor, 0.5f);
  EXPECT_EQ(s.config().growth_interval, 1000);
  EXPECT_EQ(s.config().hysteresis, 2);
  EXPECT_EQ(s.hysteresis_tracker(), 2);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, GrowsAfterTheInterval) {
  DynamicLossScaler s({.initial_scale = 1024.0f, .growth_interval = 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  // An overflow resets the growth count: three more clean steps are needed.
  s.update(false);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 2048.0f);  // hysteresis 2: the first overflow does not back off
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 4096.0f);
}

TEST(LossScaler, BacksOffWithHysteresisAndNeverBelowTheMinimum) {
  DynamicLossScaler s({.initial_scale = 64.0f, .min_scale = 4.0f, .growth_interval = 1000, .hysteresis = 2});
  s.update(true);
  EXPECT_EQ(s.scale(), 64.0f);
  EXPECT_EQ(s.hysteresis_tracker(), 1);
  s.update(false);  // a clean step does not restore the hysteresis (only a growth does)
  EXPECT_EQ(s.hysteresis_tracker(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 32.0f);
  s.update(true);  // the tracker stays used up: every further overflow backs off
  EXPECT_EQ(s.scale(), 16.0f);
  EXPECT_EQ(s.hysteresis_tracker(), -1);
  for (int i = 0; i < 5; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 4.0f);
}

// The reference, simulated by hand from Megatron's grad_scaler.py with its float32 scale.
struct Reference {
  float scale, min_scale, growth, backoff;
  int64_t interval, hysteresis, growth_tracker = 0, hysteresis_tracker;
  void update(bool inf) {
    if (inf) {
      growth_tracker = 0;
      if (--hysteresis_tracker <= 0) {
        float backed = scale * backoff;
        scale = backed > min_scale ? backed : min_scale;
      }
      return;
    }
    if (++growth_tracker == interval) {
      growth_tracker = 0;
      hysteresis_tracker = hysteresis;
      scale = scale * growth;
    }
  }
};

TEST(LossScaler, RandomSequenceMatchesReference) {
  for (int64_t hysteresis : {1, 2, 3}) {
    DynamicLossScalerConfig c{.initial_scale = 65536.0f, .min_scale = 1.0f, .growth_factor = 2.0f,
                              .backoff_factor = 0.5f, .growth_interval = 7, .hysteresis = hysteresis};
    DynamicLossScaler s(c);
    Reference r{c.initial_scale, c.min_scale, c.growth_factor, c.backoff_factor, c.growth_interval, c.hysteresis,
                0, c.hysteresis};
    std::mt19937 rng(1234 + hysteresis);
    for (int i = 0; i < 2000; ++i) {
      const bool inf = std::bernoulli_distribution(i % 300 < 100 ? 0.4 : 0.05)(rng);
      s.update(inf);
      r.update(inf);
      ASSERT_EQ(s.scale(), r.scale) << "update " << i;
      ASSERT_EQ(s.growth_tracker(), r.growth_tracker);
      ASSERT_EQ(s.hysteresis_tracker(), r.hysteresis_tracker);
    }
  }
}

TEST(LossScaler, ScaleIsRoundedToFloat32) {
  DynamicLossScaler s({.initial_scale = 3.0f, .min_scale = 1e-30f, .growth_factor = 1.1f, .backoff_factor = 0.3f,
                       .growth_interval = 1, .hysteresis = 1});
  s.update(false);
  EXPECT_EQ(s.scale(), 3.0f * 1.1f);
  s.update(true);
  EXPECT_EQ(s.scale(), (3.0f * 1.1f) * 0.3f);
  EXPECT_EQ(s.inv_scale(), float(1.0 / double((3.0f * 1.1f) * 0.3f)));
}

TEST(LossScaler, StateRoundTrip) {
  DynamicLossScaler a({.initial_scale = 256.0f, .growth_interval = 5});
  a.update(false);
  a.update(false);
  a.update(true);
  a.update(false);
  DynamicLossScaler b({.initial_scale = 256.0f, .growth_interval = 5});
  b.load_state(a.state());
  for (bool inf : {false, false, false, false, true, true, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.state().scale, b.state().scale);
    EXPECT_EQ(a.state().growth_tracker, b.state().growth_tracker);
    EXPECT_EQ(a.state().hysteresis_tracker, b.state().hysteresis_tracker);
  }
}

TEST(LossScaler, ConstantNeverChanges) {
  ConstantLossScaler s(128.0f);
  for (int i = 0; i < 10; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 128.0f);
}

TEST(LossScaler, ChoiceFromArguments) {
  train::TrainingArguments t;
  EXPECT_EQ(make_loss_scaler(t), nullptr);  // fp32
  t.bf16 = true;
  EXPECT_EQ(make_loss_scaler(t), nullptr);
  t.loss_scale = 8;
  auto bf16_constant = make_loss_scaler(t);
  ASSERT_NE(dynamic_cast<ConstantLossScaler*>(bf16_constant.get()), nullptr);
  EXPECT_EQ(bf16_constant->scale(), 8.0f);
  t.bf16 = false;
  t.fp16 = true;
  ASSERT_NE(dynamic_cast<ConstantLossScaler*>(make_loss_scaler(t).get()), nullptr);
  t.loss_scale = 0;
  t.initial_loss_scale = 65536;
  auto dynamic = make_loss_scaler(t);
  ASSERT_NE(dynamic_cast<DynamicLossScaler*>(dynamic.get()), nullptr);
  EXPECT_EQ(dynamic->scale(), 65536.0f);
}

TEST(LossScaler, RejectsBadConfigurations) {
  expect_error([] { DynamicLossScaler({.initial_scale = 0.5f, .min_scale = 1.0f}); }, {"min scale 1"});
  expect_error([] { DynamicLossScaler({.growth_factor = 1.0f}); }, {"growth factor 1"});
  expect_error([] { DynamicLossScaler({.backoff_factor = 1.0f}); }, {"backoff factor 1"});
  expect_error([] { DynamicLossScaler({.hysteresis = 0}); }, {"hysteresis 0"});
  expect_error([] { ConstantLossScaler(0.0f); }, {"loss scale 0"});
}

}  // namespace
}  // namespace megatron::optim
