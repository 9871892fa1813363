// The GPU's own activity record (runtime/gpu_activity.h) and its summary (gpu_activity_summary.h). On the CPU:
// the union of intervals against a brute-force count over a fine grid, on random intervals; the busy time,
// idle stretch and per-name totals of a summary on records built by hand, clipped to the window; the short
// kernel names. On a GPU (GpuActivityGpu): kernels, copies and memsets run while enabled come back with their
// streams and with times inside the host's window around them, nothing while disabled, and a Timeline that
// records GPU activity puts them on per-stream rows with a summary of the iteration.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "harness.h"
#include "megatron/runtime/gpu_activity_summary.h"
#include "megatron/runtime/timeline.h"
#if MEGATRON_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron {
namespace {

TEST(GpuActivitySummary, CoveredTimeIsTheUnionOfTheIntervals) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = int(rng() % 12);
    std::vector<std::pair<double, double>> intervals;
    for (int i = 0; i < n; ++i) {  // on a grid of 0.5 so the brute force below is exact
      const double s = 0.5 * double(rng() % 200), len = 0.5 * double(rng() % 40);
      intervals.emplace_back(s, s + len);
    }
    const double lo = 0.5 * double(rng() % 60), hi = lo + 0.5 * double(rng() % 200);
    int64_t cells = 0;  // brute force: the 0.25-wide cells of [lo, hi) that some interval covers
    for (double t = lo + 0.125; t < hi; t += 0.25)
      cells += std::any_of(intervals.begin(), intervals.end(), [&](const auto& iv) { return iv.first <= t && t < iv.second; });
    EXPECT_DOUBLE_EQ(covered_time(intervals, lo, hi), 0.25 * double(cells)) << "trial " << trial;
  }
}

GpuActivityRecord kernel(const std::string& name, uint32_t stream, double start, double end) {
  return {GpuActivityRecord::Kind::Kernel, name, stream, start, end, 0};
}

TEST(GpuActivitySummary, BusyTimeIdleStretchAndTimeByKernel) {
  const std::vector<GpuActivityRecord> records = {
      kernel("void gemm<bf16>(Params)", 7, 5, 25),   // overlaps the next one on another stream: busy once
      kernel("void gemm<bf16>(Params)", 9, 20, 40),
      {GpuActivityRecord::Kind::Copy, "memcpy DtoH", 7, 40, 42, 64},
      kernel("void ns::(anonymous namespace)::norm(float*)", 7, 70, 80),  // after an idle stretch of 28
      kernel("void late(int)", 7, 95, 130),  // clipped at the window's end, 100
      kernel("void early(int)", 7, -10, -1),  // before the window: left out
  };
  const GpuBusySummary g = summarize_gpu_activity(records, 0, 100);
  EXPECT_DOUBLE_EQ(g.window_us, 100);
  EXPECT_DOUBLE_EQ(g.busy_us, (42 - 5) + (80 - 70) + (100 - 95));
  EXPECT_DOUBLE_EQ(g.longest_gap_us, 70 - 42);
  EXPECT_EQ(g.kernels, 4);
  EXPECT_EQ(g.copies, 1);
  ASSERT_EQ(g.by_name.size(), 4u);
  EXPECT_EQ(g.by_name[0].name, "gemm<bf16>");
  EXPECT_EQ(g.by_name[0].launches, 2);
  EXPECT_DOUBLE_EQ(g.by_name[0].total_us, 40);  // each launch's own time: more than the busy time it covers
  EXPECT_EQ(g.by_name[1].name, "ns::(anonymous namespace)::norm");
  EXPECT_EQ(g.by_name.back().name, "memcpy DtoH");
  // Nothing ran: all idle, the whole window one stretch.
  const GpuBusySummary idle = summarize_gpu_activity({}, 10, 30);
  EXPECT_DOUBLE_EQ(idle.busy_us, 0);
  EXPECT_DOUBLE_EQ(idle.longest_gap_us, 20);
}

TEST(GpuActivitySummary, ShortKernelNames) {
  EXPECT_EQ(short_kernel_name("void megatron::ops::swiglu_kernel<__nv_bfloat16, 4>(__nv_bfloat16*, int)"),
            "megatron::ops::swiglu_kernel<__nv_bfloat16, 4>");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1");
  EXPECT_EQ(short_kernel_name("void (anonymous namespace)::fill(float*, float)"), "(anonymous namespace)::fill");
  EXPECT_EQ(short_kernel_name("void cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_128x2_tn_align8>(T1::Params)"),
            "cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_128x2_tn_align8>");
  EXPECT_EQ(short_kernel_name(std::string(150, 'k')).size(), 100u);
}

#if MEGATRON_WITH_CUDA
double host_now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST(GpuActivityGpu, RecordsKernelsCopiesAndMemsetsWithTheirStreamsAndTimes) {
  MEGATRON_REQUIRE_GPU();
  if (!GpuActivity::available()) GTEST_SKIP() << "built without CUPTI";
  Context& ctx = testing::cuda_context();
  const int64_t n = int64_t(16) << 20;
  Tensor a = ctx.empty({n}, DType::F32), b = ctx.empty({n}, DType::F32);
  ops::fill(ctx, b, 1.0);  // before recording
  ctx.synchronize();
  GpuActivity activity;
  CudaStream side;
  activity.enable();
  const double before = host_now_us();
  ops::fill(ctx, a, 2.0);
  ASSERT_EQ(cudaMemcpyAsync(a.data_ptr(), b.data_ptr(), a.nbytes(), cudaMemcpyDeviceToDevice, side.get()), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(b.data_ptr(), 0, b.nbytes(), side.get()), cudaSuccess);
  side.synchronize();
  ctx.synchronize();
  const double after = host_now_us();
  activity.disable();
  ops::fill(ctx, a, 3.0);  // after recording: not in the records
  ctx.synchronize();
  const std::vector<GpuActivityRecord> records = activity.take();
  int kernels = 0, copies = 0, memsets = 0;
  std::vector<uint32_t> streams;
  for (const GpuActivityRecord& r : records) {
    EXPECT_GE(r.start_us, before) << r.name;
    EXPECT_LE(r.end_us, after) << r.name;
    EXPECT_LE(r.start_us, r.end_us) << r.name;
    kernels += r.kind == GpuActivityRecord::Kind::Kernel;
    if (r.kind == GpuActivityRecord::Kind::Copy) {
      ++copies;
      EXPECT_EQ(r.name, "memcpy DtoD");
      EXPECT_EQ(r.bytes, uint64_t(a.nbytes()));
    }
    memsets += r.kind == GpuActivityRecord::Kind::Memset;
    streams.push_back(r.stream);
  }
  EXPECT_EQ(kernels, 1) << "the fill inside the window, not the ones before or after";
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(memsets, 1);
  std::sort(streams.begin(), streams.end());
  EXPECT_EQ(std::unique(streams.begin(), streams.end()) - streams.begin(), 2) << "ctx's stream and the side stream";
  EXPECT_EQ(activity.dropped(), 0u);
}

TEST(GpuActivityGpu, ATimelinePutsTheKernelsOnStreamRowsAndSummarisesTheIteration) {
  MEGATRON_REQUIRE_GPU();
  if (!GpuActivity::available()) GTEST_SKIP() << "built without CUPTI";
  Context& ctx = testing::cuda_context();
  Tensor a = ctx.empty({int64_t(64) << 20}, DType::F32);
  Timeline t(ctx);
  t.record_gpu_activity();
  t.begin_iteration(4);
  for (int i = 0; i < 10; ++i) ops::fill(ctx, a, double(i));
  t.collect();
  ASSERT_EQ(t.gpu_summaries().size(), 1u);
  const auto& [iteration, g] = t.gpu_summaries()[0];
  EXPECT_EQ(iteration, 4);
  EXPECT_EQ(g.kernels, 10);
  EXPECT_GT(g.busy_us, 0.0);
  EXPECT_LE(g.busy_us, g.window_us);
  int on_stream_rows = 0;
  for (const TimelineSpan& s : t.spans()) on_stream_rows += s.category.rfind("gpu stream ", 0) == 0 && s.iteration == 4;
  EXPECT_EQ(on_stream_rows, 10);
  const std::string trace = t.chrome_trace(0, "rank 0");
  EXPECT_NE(trace.find("\"name\":\"thread_name\",\"args\":{\"name\":\"gpu stream "), std::string::npos);
}
#endif

}  // namespace
}  // namespace megatron
