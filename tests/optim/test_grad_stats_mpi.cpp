// Gradient conditioning across ranks (mpiexec -np 3): the norm sums each rank's squares over the norm
// groups (so ranks holding disjoint parts count each element once), clipping uses that one norm
// everywhere, and an inf/NaN on a single rank makes every rank skip the step and back off its loss scale.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/optim/grad_clip.h"
#include "mpi_world.h"

namespace megatron::optim {
namespace {

// Rank r holds [r + 1, -(r + 1), 0.5] and [2 r]: its squares sum to 2 (r + 1)^2 + 0.25 + 4 r^2.
std::vector<Tensor> rank_grads(Context& ctx, int r) {
  Tensor a = ctx.empty(Shape{3}, DType::F32), b = ctx.empty(Shape{1}, DType::F32);
  a.data<float>()[0] = float(r + 1);
  a.data<float>()[1] = -float(r + 1);
  a.data<float>()[2] = 0.5f;
  b.data<float>()[0] = float(2 * r);
  return {a, b};
}

double squares(int r) { return 2.0 * (r + 1) * (r + 1) + 0.25 + 4.0 * r * r; }

TEST(GradStats, NormSumsSquaresOverTheNormGroups) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  const int me = world->rank();
  double total = 0;
  for (int r = 0; r < world->size(); ++r) total += squares(r);
  std::vector<Tensor> grads = rank_grads(ctx, me);
  EXPECT_NEAR(global_grad_norm(ctx, grads, GradStatsGroups{}), std::sqrt(squares(me)), 1e-6);
  EXPECT_NEAR(global_grad_norm(ctx, grads, GradStatsGroups{{world.get()}, nullptr}), std::sqrt(total), 1e-6);

  // Clipping to 1: every rank gets the same coefficient from the global norm (for the optimizer to apply);
  // the gradients themselves are left as they are.
  GradPreparation p = prepare_grads(ctx, grads, nullptr, 1.0, GradStatsGroups{{world.get()}, world.get()});
  ASSERT_TRUE(p.grad_norm.has_value());
  EXPECT_NEAR(*p.grad_norm, std::sqrt(total), 1e-6);
  const double coeff = 1.0 / (std::sqrt(total) + 1e-6);
  EXPECT_NEAR(p.grad_scale, coeff, 1e-6);
  EXPECT_NEAR(grads[0].data<float>()[0], me + 1, 1e-6);
  EXPECT_NEAR(grads[1].data<float>()[0], 2 * me, 1e-6);
  double agreed[1] = {p.grad_scale};
  world->all_reduce_host(agreed, comm::ReduceOp::Max);
  EXPECT_EQ(agreed[0], p.grad_scale) << "every rank clips with the same coefficient";
}

TEST(GradStats, OneRanksOverflowSkipsTheStepEverywhere) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  const int me = world->rank();
  DynamicLossScalerConfig config;
  config.initial_scale = 1024;
  config.hysteresis = 1;
  for (bool agree : {true, false}) {
    std::vector<Tensor> grads = rank_grads(ctx, me);
    if (me == 0) grads[1].data<float>()[0] = INFINITY;
    DynamicLossScaler scaler(config);
    // Without agreement no collective may follow (the ranks would disagree on which ones to call), so
    // the disagreeing case reduces nothing.
    GradStatsGroups groups = agree ? GradStatsGroups{{world.get()}, world.get()} : GradStatsGroups{};
    GradPreparation p = prepare_grads(ctx, grads, &scaler, 1.0, groups);
    if (agree) {
      EXPECT_TRUE(p.skip_update) << "rank " << me;
      EXPECT_FALSE(p.grad_norm.has_value());
      EXPECT_EQ(scaler.scale(), 512.0f) << "rank " << me;
    } else {
      // Without the agreement only rank 0 would skip and the others would step: the replicas diverge
      // (and rank 0 would miss the norm's all-reduce). This is what the found_inf reduction prevents.
      EXPECT_EQ(p.skip_update, me == 0);
      EXPECT_EQ(p.grad_norm.has_value(), me != 0);
    }
  }
}

}  // namespace
}  // namespace megatron::optim
