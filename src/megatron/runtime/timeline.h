// Timeline: what a rank spent its iterations on -- forward, backward, point-to-point waits, gradient reduction,
// the optimizer, and with --tp-comm-overlap the tensor-parallel GEMM chunks and the transfers beside them -- as
// spans for a Chrome trace (chrome://tracing, https://ui.perfetto.dev) and for measuring a pipeline's bubble.
//
// A span covers the work queued on ctx's stream between begin() and end(): on CUDA two timing events on the
// stream (resolved to times when the iteration is collected, after a synchronisation), plus an NVTX range so
// Nsight Systems shows the same names; on the CPU, where ops complete inside their calls, the host clock.
// Times are microseconds on the host's monotonic clock, so the ranks of one node line up in a merged trace
// (GPU times are placed relative to an event recorded when the iteration began).
//
// With record_gpu_activity() (--use-pytorch-profiler) a recorded iteration also keeps what the GPU itself ran
// (gpu_activity.h): every kernel, copy and memset becomes a span on one row per CUDA stream ("gpu stream N"),
// and gpu_summaries() holds each iteration's busy time, longest idle gap and time by kernel.
//
// Nothing is recorded while the timeline is not collecting (between iterations outside --profile's window):
// Span objects then cost a branch. A Timeline belongs to one rank and one Context.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/runtime/context.h"
#include "megatron/runtime/gpu_activity_summary.h"

namespace megatron {

struct TimelineSpan {
  std::string name;      // "forward 3.1", "recv wait", "optimizer"
  std::string category;  // "compute", "p2p", "grad-reduce", "optimizer", "schedule"
  double start_us = 0, duration_us = 0;
  int64_t iteration = 0;
};

class Timeline {
 public:
  explicit Timeline(Context& ctx);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording the spans of `iteration`; collect() ends it.
  void begin_iteration(int64_t iteration);
  // Synchronises ctx, resolves the iteration's spans to times and appends them to spans().
  void collect();
  bool recording() const { return recording_; }

  // Returns a handle for end(); a no-op (handle -1) while not recording. On CUDA the span covers the work
  // queued on `stream` (null: ctx's) between the two calls; a span on another stream must end before ctx's
  // stream has joined it, so that collect()'s synchronisation of ctx covers it.
  int begin(std::string name, const char* category, StreamHandle stream = nullptr);
  void end(int handle, StreamHandle stream = nullptr);

  // Also records the GPU's kernels, copies and memsets in the recorded iterations (needs a CUPTI build; one
  // timeline per process may do so).
  void record_gpu_activity();
  bool records_gpu_activity() const { return gpu_ != nullptr; }
  // (iteration, summary over the iteration's wall time from begin_iteration to collect) per recorded iteration.
  const std::vector<std::pair<int64_t, GpuBusySummary>>& gpu_summaries() const { return gpu_summaries_; }

  const std::vector<TimelineSpan>& spans() const { return spans_; }
  // Chrome trace-event JSON of spans() for process `pid` named `process_name` (one thread per category).
  std::string chrome_trace(int pid, const std::string& process_name) const;

 private:
  struct Open;
  void collect_gpu_activity();
  Context& ctx_;
  bool recording_ = false;
  int64_t iteration_ = 0;
  std::vector<std::unique_ptr<Open>> open_;  // this iteration's spans, in begin order
  std::vector<TimelineSpan> spans_;
  struct Device;  // CUDA events and the iteration's anchor (CUDA builds)
  std::unique_ptr<Device> device_;
  double anchor_us_ = 0;
  std::unique_ptr<GpuActivity> gpu_;
  std::vector<std::pair<int64_t, GpuBusySummary>> gpu_summaries_;
};

// RAII: a span from construction to destruction, on `timeline` (which may be null: nothing recorded). The name
// is copied only when there is a timeline, so spans on hot paths cost a branch when not profiling.
class TimelineScope {
 public:
  TimelineScope(Timeline* timeline, std::string_view name, const char* category, StreamHandle stream = nullptr)
      : timeline_(timeline), stream_(stream),
        handle_(timeline ? timeline->begin(std::string(name), category, stream) : -1) {}
  ~TimelineScope() {
    if (timeline_ && handle_ >= 0) timeline_->end(handle_, stream_);
  }
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  Timeline* timeline_;
  StreamHandle stream_;
  int handle_;
};

}  // namespace megatron
