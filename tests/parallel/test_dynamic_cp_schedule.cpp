// Dynamic context parallelism's plan: each micro-batch's CP size is Megatron's gpus_needed (the next power of
// two of longest / max-seqlen-per-rank, capped at the launch's CP size); over random lengths every micro-batch
// runs exactly once, on an aligned block of its size (in the last wave a block of at least its size: the wave's
// smallest runs grow until no rank is idle, as Megatron's fill_empty_gpus), blocks of a wave disjoint and
// covering every rank, in the fewest waves ceil(sum of sizes / CP); all micro-batches at full size give fixed
// CP in order; a rank's view of a plan marks its idle waves; bad sizes are refused by name.
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
      for (size_t w = 0; w < plan.size(); ++w) {
        std::vector<int> used(size_t(cp), 0);
        for (const CpRun& r : plan[w].runs) {
          seen.insert(r.micro_batch);
          const int needed = dynamic_cp_size(longest[size_t(r.micro_batch)], 128, cp);
          if (w + 1 < plan.size()) {
            EXPECT_EQ(r.size, needed);
          }
          EXPECT_GE(r.size, needed) << "never fewer ranks than the micro-batch needs";
          EXPECT_EQ(r.size & (r.size - 1), 0) << "a power of two";
          EXPECT_EQ(r.first_rank % r.size, 0) << "aligned block";
          ASSERT_LE(r.first_rank + r.size, cp);
          for (int k = r.first_rank; k < r.first_rank + r.size; ++k) EXPECT_EQ(used[size_t(k)]++, 0) << "rank " << k;
          total += needed;
        }
        EXPECT_EQ(std::count(used.begin(), used.end(), 1), cp) << "wave " << w << " leaves a rank idle";
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
  // Sizes 1, 4, 2, 1, 2: wave 0 = micro-batch 1 on all four; wave 1 = 2 on [0, 2), 4 on [2, 4); wave 2 would
  // be 0 on rank 0 and 3 on rank 1 with ranks 2 and 3 idle, so both grow to two ranks: 0 on [0, 2), 3 on [2, 4).
  const std::vector<int64_t> mixed = {100, 512, 200, 50, 256};
  const std::vector<CpWave> plan = plan_dynamic_cp(mixed, 128, 4);
  ASSERT_EQ(plan.size(), 3u);
  const std::vector<CpRun> rank3 = runs_of_rank(plan, 3);
  EXPECT_EQ(rank3[0].micro_batch, 1);
  EXPECT_EQ(rank3[1].micro_batch, 4);
  EXPECT_EQ(rank3[1].first_rank, 2);
  EXPECT_EQ(rank3[2].micro_batch, 3);
  EXPECT_EQ(rank3[2].first_rank, 2);
  EXPECT_EQ(rank3[2].size, 2);
  const std::vector<CpRun> rank1 = runs_of_rank(plan, 1);
  EXPECT_EQ(rank1[1].micro_batch, 2);
  EXPECT_EQ(rank1[2].micro_batch, 0);
  EXPECT_EQ(rank1[2].size, 2);
  // A lone one-rank micro-batch after full-size ones takes every rank; three sizes 2, 1, 1 at CP 8 grow to 4, 2, 2.
  const std::vector<CpWave> lone = plan_dynamic_cp(std::vector<int64_t>{1000, 100}, 128, 4);
  ASSERT_EQ(lone.size(), 2u);
  EXPECT_EQ(lone[1].runs.size(), 1u);
  EXPECT_EQ(lone[1].runs[0].size, 4);
  const std::vector<CpWave> grown = plan_dynamic_cp(std::vector<int64_t>{200, 100, 90}, 128, 8);
  ASSERT_EQ(grown.size(), 1u);
  ASSERT_EQ(grown[0].runs.size(), 3u);
  EXPECT_EQ(grown[0].runs[0].size, 4);
  EXPECT_EQ(grown[0].runs[1].size, 2);
  EXPECT_EQ(grown[0].runs[2].size, 2);
  EXPECT_EQ(grown[0].runs[2].first_rank, 6);
  // A rank's view marks the waves of a plan in which it has nothing (a plan made by hand here).
  const std::vector<CpWave> by_hand = {CpWave{{CpRun{0, 0, 1}}}};
  EXPECT_EQ(runs_of_rank(by_hand, 1)[0].micro_batch, -1) << "idle";
}

}  // namespace
}  // namespace megatron::parallel
