// Dynamic context parallelism's plan: each micro-batch's CP size is Megatron's gpus_needed (the next power of
// two of longest / max-seqlen-per-rank, capped at the launch's CP size); over random lengths every micro-batch
// runs exactly once, on an aligned block of its size, blocks of a wave disjoint, in the fewest waves
// ceil(sum of sizes / CP); all micro-batches at full size give fixed CP in order; a rank's view marks its idle
// waves; bad sizes are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "harness.h"
#include "megatron/parallel/dynamic_cp_schedule.h"

namespace megatron::parallel {
namespace {

// Megatron's BalancedCPScheduler.gpus_needed, in floating point, capped at the CP size.
int gpus_needed(int64_t longest, int64_t max_per_rank, int cp) {
  const int c = std::max(1, int(std::pow(2.0, std::ceil(std::log2(double(longest) / double(max_per_rank))))));
  return std::min(c, cp);
}

TEST(DynamicCpSchedule, SizeIsTheNextPowerOfTwoOfTheLongestSampleCapped) {
  for (int cp : {1, 2, 4, 8})
    for (int64_t longest = 1; longest <= 1100; longest += 7)
      EXPECT_EQ(dynamic_cp_size(longest, 128, cp), gpus_needed(longest, 128, cp)) << longest << " at CP " << cp;
  EXPECT_EQ(dynamic_cp_size(128, 128, 4), 1);
  EXPECT_EQ(dynamic_cp_size(129, 128, 4), 2);
  EXPECT_EQ(dynamic_cp_size(100000, 128, 4), 4);
  testing::expect_error([] { dynamic_cp_size(10, 0, 2); }, {"--max-seqlen-per-dp-cp-rank", "positive"});
  testing::expect_error([] { dynamic_cp_size(10, 8, 3); }, {"power-of-two", "3"});
}

TEST(DynamicCpSchedule, EveryMicroBatchOnceOnAlignedDisjointBlocksInTheFewestWaves) {
  std::mt19937_64 rng(3);
  for (int cp : {2, 4, 8})
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int64_t> longest(1 + rng() % 12);
      for (int64_t& l : longest) l = 1 + int64_t(rng() % 1024);
      const std::vector<CpWave> plan = plan_dynamic_cp(longest, 128, cp);
      std::multiset<int64_t> seen;
      int64_t total = 0;
      for (const CpWave& wave : plan) {
        std::vector<int> used(size_t(cp), 0);
        for (const CpRun& r : wave.runs) {
          seen.insert(r.micro_batch);
          EXPECT_EQ(r.size, dynamic_cp_size(longest[size_t(r.micro_batch)], 128, cp));
          EXPECT_EQ(r.first_rank % r.size, 0) << "aligned block";
          ASSERT_LE(r.first_rank + r.size, cp);
          for (int k = r.first_rank; k < r.first_rank + r.size; ++k) EXPECT_EQ(used[size_t(k)]++, 0) << "rank " << k;
          total += r.size;
        }
      }
      EXPECT_EQ(seen.size(), longest.size());
      for (int64_t m = 0; m < int64_t(longest.size()); ++m) EXPECT_EQ(seen.count(m), 1u) << "micro-batch " << m;
      EXPECT_EQ(int64_t(plan.size()), (total + cp - 1) / cp) << "the fewest waves";
    }
}

TEST(DynamicCpSchedule, FullSizeIsFixedCpAndRanksSeeTheirIdleWaves) {
  const std::vector<int64_t> all_long = {900, 513, 1000};
  const std::vector<CpWave> fixed = plan_dynamic_cp(all_long, 128, 4);
  ASSERT_EQ(fixed.size(), 3u);
  for (int64_t m = 0; m < 3; ++m) {
    ASSERT_EQ(fixed[size_t(m)].runs.size(), 1u);
    EXPECT_EQ(fixed[size_t(m)].runs[0].micro_batch, m);
    EXPECT_EQ(fixed[size_t(m)].runs[0].size, 4);
  }
  // Sizes 1, 4, 2, 1, 2: wave 0 = micro-batch 1 on all four; wave 1 = 2 on [0, 2), 4 on [2, 4);
  // wave 2 = 0 on rank 0, 3 on rank 1, ranks 2 and 3 idle.
  const std::vector<int64_t> mixed = {100, 512, 200, 50, 256};
  const std::vector<CpWave> plan = plan_dynamic_cp(mixed, 128, 4);
  ASSERT_EQ(plan.size(), 3u);
  const std::vector<CpRun> rank3 = runs_of_rank(plan, 3);
  EXPECT_EQ(rank3[0].micro_batch, 1);
  EXPECT_EQ(rank3[1].micro_batch, 4);
  EXPECT_EQ(rank3[1].first_rank, 2);
  EXPECT_EQ(rank3[2].micro_batch, -1) << "idle";
  const std::vector<CpRun> rank1 = runs_of_rank(plan, 1);
  EXPECT_EQ(rank1[1].micro_batch, 2);
  EXPECT_EQ(rank1[2].micro_batch, 3);
  EXPECT_EQ(rank1[2].size, 1);
}

}  // namespace
}  // namespace megatron::parallel
