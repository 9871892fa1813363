// Timers (runtime/timers.h) on the CPU: a timer adds up its intervals until reset, a timer above the log level
// is never started (and reads 0), starting a running timer is an error, and the host clock measures the time
// between start and stop.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "harness.h"
#include "megatron/runtime/timers.h"

namespace megatron {
namespace {

TEST(Timers, AccumulateUntilResetAndKeepTheirLevel) {
  Timers timers(testing::cpu_context(), 1);
  for (int i = 0; i < 3; ++i) {
    TimerScope once_per_iteration(&timers, "forward-backward", 1);
    TimerScope per_micro_batch(&timers, "forward-compute", 2);  // above the level: not started
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  timers.collect();
  const double total = timers.elapsed_seconds("forward-backward");
  EXPECT_GE(total, 0.060);
  EXPECT_LT(total, 2.0);
  EXPECT_EQ(timers.elapsed_seconds("forward-compute"), 0.0);
  EXPECT_EQ(timers.elapsed_seconds("never-named"), 0.0);
  timers.reset();
  EXPECT_EQ(timers.elapsed_seconds("forward-backward"), 0.0);
  timers.start("optimizer", 1);
  testing::expect_error([&] { timers.start("optimizer", 1); }, {"timer 'optimizer' has already been started"});
  timers.stop("optimizer");
  timers.stop("optimizer");  // stopping a stopped timer does nothing
  EXPECT_TRUE(timers.enabled(1));
  EXPECT_FALSE(timers.enabled(2));
}

TEST(Timers, LevelZeroStartsNothing) {
  Timers timers(testing::cpu_context(), 0);
  { TimerScope t(&timers, "forward-backward", 1); }
  { TimerScope t(nullptr, "forward-backward", 1); }  // no timers: nothing
  EXPECT_EQ(timers.elapsed_seconds("forward-backward"), 0.0);
}

}  // namespace
}  // namespace megatron
