// Timers (runtime/timers.h): on the CPU a timer adds up its intervals until reset, a timer above the log level
// is never started (and reads 0), starting a running timer is an error, and the host clock measures the time
// between start and stop. On a GPU (TimersGpu, label gpu) a device timer measures the work queued on the stream
// between start and stop, read only by collect() after a synchronisation, while a host timer around the same
// launches sees only the launches.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
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

// Device-to-device copies of 256 MiB, `n` times, queued on ctx's stream.
void queue_copies(Context& ctx, const Tensor& dst, const Tensor& src, int n) {
  for (int i = 0; i < n; ++i) copy_tensor(ctx, dst, src);
}

TEST(TimersGpu, DeviceTimersMeasureTheStreamsWorkOnceCollected) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = testing::cuda_context();
  const int64_t n = int64_t(64) << 20;  // floats: 256 MiB
  Tensor a = ctx.empty({n}, DType::F32), b = ctx.empty({n}, DType::F32);
  copy_tensor(ctx, a, b);  // first touch outside the timed region
  ctx.synchronize();
  Timers timers(ctx, 2);
  const auto wall_start = std::chrono::steady_clock::now();
  timers.start("forward-compute", 2);
  timers.start("batch-generator", 2, TimerClock::Host);
  queue_copies(ctx, a, b, 20);
  timers.stop("batch-generator");
  timers.stop("forward-compute");
  EXPECT_EQ(timers.elapsed_seconds("forward-compute"), 0.0) << "read only by collect()";
  ctx.synchronize();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  timers.collect();
  const double once = timers.elapsed_seconds("forward-compute");
  // 20 x 512 MiB of traffic: well over 1 ms on any GPU, and never longer than the host waited for it.
  EXPECT_GT(once, 1e-3);
  EXPECT_LE(once, wall + 1e-4);
  EXPECT_LT(timers.elapsed_seconds("batch-generator"), once) << "the host only queued the copies";
  // A second interval of the same work adds about as much again.
  timers.start("forward-compute", 2);
  queue_copies(ctx, a, b, 20);
  timers.stop("forward-compute");
  ctx.synchronize();
  timers.collect();
  const double twice = timers.elapsed_seconds("forward-compute");
  EXPECT_GT(twice, 1.5 * once);
  EXPECT_LT(twice, 2.5 * once);
}

}  // namespace
}  // namespace megatron
