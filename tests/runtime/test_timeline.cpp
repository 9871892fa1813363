// The timeline (runtime/timeline.h) on the CPU: spans are recorded only between begin_iteration and collect,
// nest, carry their iteration, and come out as Chrome trace events (complete "X" events on one row per kind of
// work, with process and thread names) whose times cover the work inside them. On a GPU (TimelineGpu) a span
// on another stream times that stream's work, not ctx's.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "harness.h"
#include "megatron/runtime/timeline.h"
#if MEGATRON_WITH_CUDA
#include <cuda_runtime.h>

#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron {
namespace {

TEST(Timeline, RecordsNestedSpansOnlyWhileRecordingAndWritesAChromeTrace) {
  Context& ctx = testing::cpu_context();
  Timeline t(ctx);
  { TimelineScope ignored(&t, "before", "compute"); }  // not recording yet
  t.begin_iteration(7);
  {
    TimelineScope outer(&t, "schedule", "schedule");
    TimelineScope inner(&t, "forward 0", "compute");
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  { TimelineScope none(nullptr, "no timeline", "compute"); }
  t.collect();
  { TimelineScope after(&t, "after", "compute"); }
  ASSERT_EQ(t.spans().size(), 2u);
  const TimelineSpan& schedule = t.spans()[0];
  const TimelineSpan& forward = t.spans()[1];
  EXPECT_EQ(schedule.name, "schedule");
  EXPECT_EQ(forward.category, "compute");
  EXPECT_EQ(forward.iteration, 7);
  EXPECT_GE(forward.duration_us, 2500.0);
  EXPECT_LE(schedule.start_us, forward.start_us);
  EXPECT_GE(schedule.start_us + schedule.duration_us, forward.start_us + forward.duration_us);
  const std::string json = t.chrome_trace(3, "rank \"3\"");
  for (const char* part : {R"("ph":"X")", R"("name":"forward 0")", R"("cat":"compute")", R"("pid":3)",
                           R"("name":"process_name")", R"("name":"rank \"3\"")", R"("args":{"iteration":7})",
                           R"("args":{"name":"tp-comm"})", R"("args":{"name":"tp-gemm"})"})
    EXPECT_NE(json.find(part), std::string::npos) << part << " in " << json;
  EXPECT_EQ(json.front(), '[');
  testing::expect_error([&] {
    t.begin_iteration(8);
    t.begin_iteration(9);
  }, {"iteration 9 begins before iteration 8 was collected"});
}

#if MEGATRON_WITH_CUDA
TEST(TimelineGpu, ASpanOnAnotherStreamTimesThatStreamsWork) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = testing::cuda_context();
  const int64_t n = int64_t(64) << 20;  // floats: 256 MiB
  Tensor a = ctx.empty({n}, DType::F32), b = ctx.empty({n}, DType::F32);
  copy_tensor(ctx, a, b);  // first touch outside the timed region
  ctx.synchronize();
  CudaStream side;
  CudaEvent forked, joined;
  Timeline t(ctx);
  t.begin_iteration(1);
  forked.record(ctx.stream());
  side.wait(forked.get());
  {
    TimelineScope on_side(&t, "copies on the side stream", "tp-comm", side.get());
    TimelineScope on_ctx(&t, "ctx's stream, idle", "tp-gemm");
    for (int i = 0; i < 20; ++i)
      ASSERT_EQ(cudaMemcpyAsync(a.data_ptr(), b.data_ptr(), a.nbytes(), cudaMemcpyDeviceToDevice, side.get()),
                cudaSuccess);
  }
  joined.record(side.get());
  ASSERT_EQ(cudaStreamWaitEvent(ctx.stream(), joined.get(), 0), cudaSuccess);
  t.collect();  // synchronises ctx, which waited for the side stream
  ASSERT_EQ(t.spans().size(), 2u);
  const TimelineSpan& copies = t.spans()[0];  // in the order they began
  const TimelineSpan& idle = t.spans()[1];
  ASSERT_EQ(copies.category, "tp-comm");
  // 20 x 512 MiB of traffic: well over 1 ms on any GPU; ctx's stream had nothing queued meanwhile.
  EXPECT_GT(copies.duration_us, 1000.0);
  EXPECT_LT(idle.duration_us, 0.1 * copies.duration_us);
}
#endif

}  // namespace
}  // namespace megatron
