// Tests of the Sinkhorn routing ops (ops/router/sinkhorn.h). router_sinkhorn on the CPU is checked against
// Megatron's loop written directly in double (plain sums in order, no interleaved partials): equal to 1e-12
// for F64 logits and to fp32's accumulated rounding for F32, BF16 and F16; and against what balancing means:
// every column of the result sums to 1/E and every row to 1/T within the stopping tolerance. Logits that
// overflow exp end the loop at once (no hang). The CUDA path must give the CPU's bits for every dtype and
// shape: one block or many, a last row chunk shorter than the others, chunks longer than 64 rows (T > 16384),
// and more experts than a block has threads. router_scores_at gathers the gates; the CPU
// refuses an index outside the experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/ops/router/sinkhorn.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using enum DType;

Context& cpu() { return testing::cpu_context(); }

// Normal logits of standard deviation `spread` in dtype dt, on the CPU, and their values as doubles.
Tensor random_logits(int64_t T, int64_t E, DType dt, double spread, uint64_t seed) {
  Tensor t = cpu().empty(Shape{T, E}, dt);
  testing::fill_normal(t, seed, spread);
  return t;
}

// Megatron's sinkhorn(exp(x)) in double, sums in plain order.
std::vector<double> direct_sinkhorn(const std::vector<double>& x, int64_t T, int64_t E) {
  std::vector<double> cost(x.size()), d0(static_cast<size_t>(T)), d1(static_cast<size_t>(E), 1.0);
  for (size_t i = 0; i < x.size(); ++i) cost[i] = std::exp(x[i]);
  for (double error = 1e9; error > 1e-4;) {
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[size_t(e)] * cost[size_t(t * E + e)];
      d0[size_t(t)] = (1.0 / double(T)) / (s + 1e-8);
    }
    error = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += d0[size_t(t)] * cost[size_t(t * E + e)];
      const double next = (1.0 / double(E)) / (s + 1e-8);
      error += std::fabs(d1[size_t(e)] - next) / double(E);
      d1[size_t(e)] = next;
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) cost[size_t(t * E + e)] *= d1[size_t(e)] * d0[size_t(t)];
  return cost;
}

// indices [T, k] on the CPU, each uniform in [0, E).
Tensor random_indices(int64_t T, int64_t k, int64_t E, uint32_t seed) {
  Tensor indices = cpu().empty(Shape{T, k}, I32);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < T * k; ++i) indices.data<int32_t>()[i] = int32_t(rng() % E);
  return indices;
}

Tensor balanced_on(Context& ctx, const Tensor& host_logits) {
  const Tensor logits = testing::copy_on(ctx, host_logits);
  Tensor out = ctx.empty(logits.shape(), logits.dtype() == F64 ? F64 : F32);
  ops::router_sinkhorn(ctx, out, logits);
  return out;
}

struct Case {
  int64_t T, E;
  DType dt;
  double spread;
};

std::string describe(const Case& c) {
  return str_cat(dtype_name(c.dt), " T=", c.T, " E=", c.E, " spread ", c.spread);
}

TEST(RouterSinkhorn, MatchesMegatronsLoopAndBalancesTheMatrix) {
  const Case cases[] = {{1, 1, F64, 1.0},  {1, 8, F64, 1.0},   {7, 3, F64, 2.0},   {300, 8, F64, 1.0},
                        {1000, 6, F32, 1.0}, {513, 160, F32, 0.5}, {257, 64, BF16, 2.0}, {129, 8, F16, 1.0},
                        {2000, 2, F32, 3.0},  {20011, 5, F32, 1.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const Tensor logits = random_logits(c.T, c.E, c.dt, c.spread, testing::seed_from(describe(c)));
    const std::vector<double> x = testing::to_doubles(cpu(), logits), ref = direct_sinkhorn(x, c.T, c.E);
    const std::vector<double> got = testing::to_doubles(cpu(), balanced_on(cpu(), logits));
    // fp32 rounds every sum and may stop an iteration earlier or later than double; F64 differs from the plain
    // order only in the last bits.
    const double tolerance = c.dt == F64 ? 1e-12 : 2e-3;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / ref[i]);
    EXPECT_LT(worst, tolerance);
    // Balanced: columns sum to 1/E (the last step scaled them), rows to 1/T within the stopping tolerance.
    for (int64_t e = 0; e < c.E; ++e) {
      double s = 0;
      for (int64_t t = 0; t < c.T; ++t) s += got[size_t(t * c.E + e)];
      EXPECT_NEAR(s * double(c.E), 1.0, c.dt == F64 ? 1e-6 : 1e-3) << "column " << e;
    }
    for (int64_t t = 0; t < c.T; t += std::max<int64_t>(1, c.T / 50)) {
      double s = 0;
      for (int64_t e = 0; e < c.E; ++e) s += got[size_t(t * c.E + e)];
      EXPECT_NEAR(s * double(c.T), 1.0, 0.05) << "row " << t;
    }
  }
}

TEST(RouterSinkhorn, OverflowingLogitsEndTheLoop) {
  Tensor logits = cpu().empty(Shape{4, 3}, F32);
  for (int64_t i = 0; i < 12; ++i) logits.data<float>()[i] = i == 5 ? 1000.0f : 0.5f;  // exp overflows to inf
  const std::vector<double> got = testing::to_doubles(cpu(), balanced_on(cpu(), logits));
  EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](double v) { return !std::isfinite(v); }));
}

TEST(RouterSinkhorn, RefusesMismatchedArguments) {
  Tensor logits = random_logits(4, 3, F32, 1.0, 1), wrong = cpu().empty(Shape{4, 3}, F64);
  expect_error([&] { ops::router_sinkhorn(cpu(), wrong, logits); }, {"router_sinkhorn", "balanced"});
  Tensor scores = random_logits(4, 3, F32, 1.0, 2), probs = cpu().empty(Shape{4, 2}, F32);
  Tensor indices = cpu().empty(Shape{4, 2}, I32);
  for (int64_t i = 0; i < 8; ++i) indices.data<int32_t>()[i] = int32_t(i % 3);
  indices.data<int32_t>()[5] = 3;
  expect_error([&] { ops::router_scores_at(cpu(), probs, scores, indices); }, {"indices[2, 1] = 3", "not an expert"});
}

TEST(RouterSinkhorn, ScoresAtGathersTheChosenExperts) {
  const int64_t T = 37, E = 9, k = 3;
  const Tensor scores = random_logits(T, E, F64, 1.0, 3);
  const Tensor indices = random_indices(T, k, E, 4);
  Tensor probs = cpu().empty(Shape{T, k}, F64);
  ops::router_scores_at(cpu(), probs, scores, indices);
  for (int64_t i = 0; i < T * k; ++i)
    EXPECT_EQ(probs.data<double>()[i], scores.data<double>()[(i / k) * E + indices.data<int32_t>()[i]]);
  // No slot per token: nothing to gather, and no error.
  Tensor none = cpu().empty(Shape{T, 0}, I32), no_probs = cpu().empty(Shape{T, 0}, F64);
  ops::router_scores_at(cpu(), no_probs, scores, none);
}

TEST(RouterSinkhornGpu, EqualsTheCpuBitForBit) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  const Case cases[] = {{1, 1, F32, 1.0},    {5, 8, F32, 1.0},     {1000, 6, F32, 1.0}, {4099, 8, F32, 2.0},
                        {513, 160, F32, 0.5}, {257, 64, BF16, 2.0}, {129, 8, F16, 1.0},  {33, 1100, F32, 1.0},
                        {8192, 8, F32, 1.0},  {8192, 128, F32, 1.0}, {3, 2048, F32, 1.0}, {20011, 8, F32, 2.0},
                        {70001, 4, BF16, 1.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const Tensor logits = random_logits(c.T, c.E, c.dt, c.spread, testing::seed_from(describe(c)));
    const std::vector<double> want = testing::to_doubles(cpu(), balanced_on(cpu(), logits));
    const std::vector<double> got = testing::to_doubles(gpu, balanced_on(gpu, logits));
    ASSERT_EQ(got.size(), want.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += !(got[i] == want[i]);
    EXPECT_EQ(differ, 0) << "of " << got.size();
  }
}

TEST(RouterSinkhornGpu, ScoresAtEqualsTheCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  const int64_t T = 301, E = 12, k = 2;
  const Tensor scores = random_logits(T, E, F32, 1.0, 5);
  const Tensor indices = random_indices(T, k, E, 6);
  Tensor want = cpu().empty(Shape{T, k}, F32);
  ops::router_scores_at(cpu(), want, scores, indices);
  Tensor probs = gpu.empty(Shape{T, k}, F32);
  ops::router_scores_at(gpu, probs, testing::copy_on(gpu, scores), testing::copy_on(gpu, indices));
  EXPECT_EQ(testing::to_doubles(gpu, probs), testing::to_doubles(cpu(), want));
  // k == 0 launches nothing (a grid of zero blocks would be a launch error).
  ops::router_scores_at(gpu, gpu.empty(Shape{T, 0}, F32), testing::copy_on(gpu, scores), gpu.empty(Shape{T, 0}, I32));
  gpu.synchronize();
}

}  // namespace
}  // namespace megatron
