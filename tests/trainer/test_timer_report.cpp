// Megatron's timer report (trainer/timer_report.h) character for character, from Megatron's format strings
// (megatron/core/timers.py): names padded with dots to 48 characters, two decimals, min over the ranks that
// recorded a timer, timers no rank recorded left out; and the names and order of each --timing-log-level.
#include <gtest/gtest.h>

#include "megatron/trainer/timer_report.h"

namespace megatron::trainer {
namespace {

const std::vector<std::string> kNames = {"forward-backward", "all-grads-sync", "optimizer"};
// [rank][name], ms per iteration; rank 1 never ran all-grads-sync, nobody ran optimizer.
const std::vector<std::vector<double>> kTimes = {{305.774, 12.5, 0.0}, {301.119, 0.0, 0.0}};

TEST(TimerReport, MinMaxIsMegatronsDefault) {
  EXPECT_EQ(format_timer_report(kNames, kTimes, "minmax"),
            "(min, max) time across ranks (ms):"
            "\n    forward-backward ...............................: (301.12, 305.77)"
            "\n    all-grads-sync .................................: (12.50, 12.50)");
}

TEST(TimerReport, MaxAndAllRanks) {
  EXPECT_EQ(format_timer_report(kNames, kTimes, "max"),
            "max time across ranks (ms):"
            "\n    forward-backward ...............................: 305.77"
            "\n    all-grads-sync .................................: 12.50");
  EXPECT_EQ(format_timer_report(kNames, kTimes, "all"),
            "times across ranks (ms):"
            "\n  forward-backward:"
            "\n     rank  0: 305.77"
            "\n     rank  1: 301.12"
            "\n  all-grads-sync:"
            "\n     rank  0: 12.50");
}

TEST(TimerReport, NothingRecordedPrintsNothing) {
  const std::vector<std::vector<double>> none = {{0.0, 0.0, 0.0}};
  for (const char* option : {"max", "minmax", "all"}) EXPECT_EQ(format_timer_report(kNames, none, option), "");
}

TEST(TimerReport, LevelsNameMegatronsTimersInItsOrder) {
  EXPECT_TRUE(megatron_timer_names(0).empty());
  const std::vector<std::string> one = megatron_timer_names(1), two = megatron_timer_names(2);
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(one.front(), "forward-backward");
  EXPECT_EQ(one.back(), "optimizer");
  ASSERT_EQ(two.size(), 27u);
  EXPECT_TRUE(std::equal(one.begin(), one.end(), two.begin()));
  EXPECT_EQ(two[12], "batch-generator");
  EXPECT_EQ(two[13], "forward-compute");
  EXPECT_EQ(two[14], "backward-compute");
  EXPECT_EQ(two[23], "forward-backward-send-forward-backward-recv");
  EXPECT_EQ(two.back(), "moe-combine-all-to-all");  // ours follow Megatron's
}

}  // namespace
}  // namespace megatron::trainer
