// Gradient conditioning on the CPU: the global norm against a double sum over mixed-dtype tensors, clipping
// to max_norm (and no change below it), unscaling with inf/NaN detection, Megatron's skip logic with a
// dynamic loss scaler, and skipped-iteration counting.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness.h"
#include "megatron/core/float_types.h"
#include "megatron/optim/grad_clip.h"

namespace megatron::optim {
namespace {

using testing::cpu_context;
using testing::fill_normal;
using testing::to_doubles;

std::vector<Tensor> make_grads(Context& ctx, double scale = 1.0) {
  const std::vector<std::pair<int64_t, DType>> specs = {
      {1031, DType::F32}, {7, DType::BF16}, {0, DType::F32}, {258, DType::F16}, {65, DType::F64}, {4099, DType::F32}};
  std::vector<Tensor> grads;
  uint64_t seed = 11;
  for (auto [n, dt] : specs) {
    Tensor t = ctx.empty(Shape{n}, dt);
    fill_normal(t, seed++, scale);
    grads.push_back(t);
  }
  return grads;
}

double double_norm(Context& ctx, const std::vector<Tensor>& grads) {
  double sum = 0;
  for (const Tensor& g : grads)
    for (double x : to_doubles(ctx, g)) sum += x * x;
  return std::sqrt(sum);
}

std::vector<std::vector<double>> snapshot(Context& ctx, const std::vector<Tensor>& grads) {
  std::vector<std::vector<double>> v;
  for (const Tensor& g : grads) v.push_back(to_doubles(ctx, g));
  return v;
}

TEST(GradClip, NormEqualsADoubleSum) {
  Context& ctx = cpu_context();
  std::vector<Tensor> grads = make_grads(ctx, 0.01);
  const double expected = double_norm(ctx, grads);
  EXPECT_NEAR(global_grad_norm(ctx, grads), expected, 1e-6 * expected);
  EXPECT_EQ(global_grad_norm(ctx, {}), 0.0);
}

TEST(GradClip, ClipsToMaxNorm) {
  Context& ctx = cpu_context();
  std::vector<Tensor> grads = make_grads(ctx);
  const auto before = snapshot(ctx, grads);
  const double norm = double_norm(ctx, grads);
  const double max_norm = norm / 3;
  const double returned = clip_grad_norm(ctx, grads, max_norm);
  EXPECT_NEAR(returned, norm, 1e-6 * norm);  // the norm before clipping
  const double after = double_norm(ctx, grads);
  EXPECT_NEAR(after, max_norm, 1e-3 * max_norm);  // bf16/fp16 rounding of the scaled values
  // Every element scaled by the same coefficient max_norm / (norm + 1e-6).
  const double coeff = max_norm / (returned + 1e-6);
  const auto now = snapshot(ctx, grads);
  for (size_t i = 0; i < grads.size(); ++i) {
    const double tol = grads[i].dtype() == DType::BF16 ? 1e-2 : grads[i].dtype() == DType::F16 ? 1e-3 : 1e-6;
    for (size_t k = 0; k < now[i].size(); ++k)
      ASSERT_NEAR(now[i][k], before[i][k] * coeff, tol * std::abs(before[i][k] * coeff) + 1e-30) << i << "," << k;
  }
  // The F32 and F64 tensors hold exactly the fp32 product (the op's arithmetic).
  EXPECT_EQ(now[0][5], double(float(before[0][5]) * float(coeff)));
}

TEST(GradClip, NoChangeBelowMaxNorm) {
  Context& ctx = cpu_context();
  std::vector<Tensor> grads = make_grads(ctx);
  const auto before = snapshot(ctx, grads);
  const double norm = double_norm(ctx, grads);
  EXPECT_NEAR(clip_grad_norm(ctx, grads, 2 * norm), norm, 1e-6 * norm);
  EXPECT_EQ(snapshot(ctx, grads), before);
  EXPECT_EQ(clip_grads_by_total_norm(ctx, grads, 1.0, std::numeric_limits<double>::quiet_NaN()), 1.0);
  EXPECT_EQ(snapshot(ctx, grads), before);  // a NaN norm never clips
}

TEST(GradClip, UnscaleDetectsInfAndNan) {
  Context& ctx = cpu_context();
  std::vector<Tensor> grads = make_grads(ctx, 1024.0);
  const auto before = snapshot(ctx, grads);
  EXPECT_FALSE(unscale_and_check_for_inf(ctx, grads, 1.0f / 1024.0f));
  const auto now = snapshot(ctx, grads);
  EXPECT_EQ(now[0][3], before[0][3] / 1024.0);
  EXPECT_EQ(now[4][3], before[4][3] / 1024.0);

  grads[3].data<fp16_t>()[17] = fp16_t{0x7c00};  // +inf in the fp16 tensor
  EXPECT_TRUE(unscale_and_check_for_inf(ctx, grads, 0.5f));
  grads = make_grads(ctx);
  grads[5].data<float>()[4098] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(unscale_and_check_for_inf(ctx, grads, 0.5f));
  EXPECT_FALSE(unscale_and_check_for_inf(ctx, {}, 0.5f));
}

TEST(GradClip, PrepareGradsSkipsOverflowsAndUpdatesTheScaler) {
  Context& ctx = cpu_context();
  DynamicLossScaler scaler({.initial_scale = 256.0f, .growth_interval = 1000, .hysteresis = 1});
  SkippedIterations skipped;

  // Clean: unscaled by 1/256, then the norm of the unscaled grads, clipped to 1.
  std::vector<Tensor> grads = make_grads(ctx, 256.0);
  std::vector<Tensor> reference = make_grads(ctx, 1.0);  // same seeds: the unscaled values
  const double ref_norm = double_norm(ctx, reference);
  GradPreparation r = prepare_grads(ctx, grads, &scaler, 1.0);
  skipped.record(r.skip_update);
  EXPECT_FALSE(r.skip_update);
  ASSERT_TRUE(r.grad_norm.has_value());
  EXPECT_NEAR(*r.grad_norm, ref_norm, 1e-3 * ref_norm);
  // The clip coefficient is returned for the optimizer to apply; the gradients are left as they are.
  EXPECT_NEAR(double_norm(ctx, grads), ref_norm, 1e-3 * ref_norm);
  EXPECT_NEAR(r.grad_scale * double_norm(ctx, grads), 1.0, 1e-3);
  EXPECT_EQ(scaler.growth_tracker(), 1);

  // Overflow: skipped, scale backed off, no norm.
  grads = make_grads(ctx, 256.0);
  grads[0].data<float>()[0] = std::numeric_limits<float>::infinity();
  r = prepare_grads(ctx, grads, &scaler, 1.0);
  skipped.record(r.skip_update);
  EXPECT_TRUE(r.skip_update);
  EXPECT_FALSE(r.grad_norm.has_value());
  EXPECT_EQ(scaler.scale(), 128.0f);

  // No clipping: no norm (Megatron's None); no scaler: never skipped.
  grads = make_grads(ctx);
  r = prepare_grads(ctx, grads, nullptr, 0.0);
  skipped.record(r.skip_update);
  EXPECT_FALSE(r.skip_update);
  EXPECT_FALSE(r.grad_norm.has_value());
  grads[1].data<bf16_t>()[0] = bf16_t{0x7fc0};  // NaN, but bf16 training does not check
  r = prepare_grads(ctx, grads, nullptr, 1.0);
  skipped.record(r.skip_update);
  EXPECT_FALSE(r.skip_update);
  ASSERT_TRUE(r.grad_norm.has_value());
  EXPECT_TRUE(std::isnan(*r.grad_norm));

  EXPECT_EQ(skipped.total(), 1);
  EXPECT_EQ(skipped.take_interval(), 1);
  EXPECT_EQ(skipped.take_interval(), 0);
  skipped.record(true);
  skipped.record(true);
  EXPECT_EQ(skipped.interval(), 2);
  EXPECT_EQ(skipped.total(), 3);
}

}  // namespace
}  // namespace megatron::optim
