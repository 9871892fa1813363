#include "megatron/runtime/timeline.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "megatron/core/error.h"

#if MEGATRON_WITH_CUDA
#include <nvtx3/nvToolsExt.h>

#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron {
namespace {

double host_now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kFirstExtraRow = 9;

// Chrome trace "threads": one row per kind of work, in this order; other categories get rows from
// kFirstExtraRow on.
int thread_of(const std::string& category) {
  static const std::map<std::string, int> rows = {
      {"schedule", 0}, {"compute", 1}, {"p2p", 2},         {"grad-reduce", 3},  {"optimizer", 4},
      {"tp-gemm", 5},  {"tp-comm", 6}, {"cp-attention", 7}, {"cp-comm", 8}};
  auto it = rows.find(category);
  return it == rows.end() ? kFirstExtraRow : it->second;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

#if MEGATRON_WITH_CUDA
struct Timeline::Device {
  std::vector<std::unique_ptr<CudaEvent>> pool;
  size_t used = 0;
  CudaEvent anchor{true};
  CudaEvent* take() {
    if (used == pool.size()) pool.push_back(std::make_unique<CudaEvent>(true));
    return pool[used++].get();
  }
};
struct Timeline::Open {
  TimelineSpan span;
  double host_start = 0, host_end = 0;
  CudaEvent* start = nullptr;
  CudaEvent* end = nullptr;
};
#else
struct Timeline::Device {};
struct Timeline::Open {
  TimelineSpan span;
  double host_start = 0, host_end = 0;
};
#endif

Timeline::Timeline(Context& ctx) : ctx_(ctx) {
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda()) device_ = std::make_unique<Device>();
#endif
}

Timeline::~Timeline() = default;

void Timeline::record_gpu_activity() {
  if (!gpu_) gpu_ = std::make_unique<GpuActivity>();
}

void Timeline::begin_iteration(int64_t iteration) {
  MEGATRON_CHECK(!recording_, "Timeline: iteration ", iteration, " begins before iteration ", iteration_,
                 " was collected");
  recording_ = true;
  iteration_ = iteration;
  if (gpu_) {
    gpu_->take();  // anything from before this iteration
    gpu_->enable();
  }
  anchor_us_ = host_now_us();
#if MEGATRON_WITH_CUDA
  if (device_) device_->anchor.record(ctx_.stream());
#endif
}

int Timeline::begin(std::string name, const char* category, StreamHandle stream) {
  if (!recording_) return -1;
  auto open = std::make_unique<Open>();
  open->span = TimelineSpan{std::move(name), category, 0, 0, iteration_};
  open->host_start = host_now_us();
#if MEGATRON_WITH_CUDA
  if (device_) {
    open->start = device_->take();
    open->start->record(stream != nullptr ? stream : ctx_.stream());
    if (stream == nullptr) nvtxRangePushA(open->span.name.c_str());  // NVTX ranges nest on the host thread
  }
#endif
  open_.push_back(std::move(open));
  return int(open_.size()) - 1;
}

void Timeline::end(int handle, StreamHandle stream) {
  if (!recording_ || handle < 0) return;
  MEGATRON_CHECK(size_t(handle) < open_.size(), "Timeline: unknown span ", handle);
  Open& open = *open_[size_t(handle)];
  open.host_end = host_now_us();
#if MEGATRON_WITH_CUDA
  if (device_) {
    open.end = device_->take();
    open.end->record(stream != nullptr ? stream : ctx_.stream());
    if (stream == nullptr) nvtxRangePop();
  }
#endif
}

void Timeline::collect() {
  if (!recording_) return;
  ctx_.synchronize();
  for (const std::unique_ptr<Open>& open : open_) {
    TimelineSpan span = open->span;
    span.start_us = open->host_start;
    span.duration_us = open->host_end - open->host_start;
#if MEGATRON_WITH_CUDA
    if (device_ && open->start && open->end) {  // the device's times, placed after the iteration's anchor
      span.start_us = anchor_us_ + 1000.0 * open->start->elapsed_ms_since(device_->anchor);
      span.duration_us = 1000.0 * open->end->elapsed_ms_since(*open->start);
    }
#endif
    spans_.push_back(std::move(span));
  }
  open_.clear();
#if MEGATRON_WITH_CUDA
  if (device_) device_->used = 0;
#endif
  if (gpu_) collect_gpu_activity();
  recording_ = false;
}

void Timeline::collect_gpu_activity() {
  const double window_end = host_now_us();  // after collect()'s synchronisation: the iteration's work is done
  gpu_->disable();
  const std::vector<GpuActivityRecord> records = gpu_->take();
  gpu_summaries_.emplace_back(iteration_, summarize_gpu_activity(records, anchor_us_, window_end));
  for (const GpuActivityRecord& r : records) {
    if (r.end_us <= anchor_us_ || r.start_us >= window_end) continue;
    const std::string name = r.kind == GpuActivityRecord::Kind::Kernel ? short_kernel_name(r.name)
                                                                        : str_cat(r.name, " ", r.bytes, " B");
    spans_.push_back(TimelineSpan{name, str_cat("gpu stream ", r.stream), r.start_us, r.end_us - r.start_us,
                                  iteration_});
  }
}

std::string Timeline::chrome_trace(int pid, const std::string& process_name) const {
  std::string out = "[\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, R"({"ph":"M","pid":%d,"name":"process_name","args":{"name":)", pid);
  out += buf + json_string(process_name) + "}}";
  for (const char* row :
       {"schedule", "compute", "p2p", "grad-reduce", "optimizer", "tp-gemm", "tp-comm", "cp-attention", "cp-comm"}) {
    std::snprintf(buf, sizeof buf, R"(,
{"ph":"M","pid":%d,"tid":%d,"name":"thread_name","args":{"name":"%s"}})", pid, thread_of(row), row);
    out += buf;
  }
  // Rows beyond the fixed ones (the GPU's streams), numbered in order of first appearance.
  std::map<std::string, int> extra_rows;
  for (const TimelineSpan& s : spans_) {
    if (thread_of(s.category) < kFirstExtraRow || extra_rows.count(s.category)) continue;
    const int row = kFirstExtraRow + int(extra_rows.size());
    extra_rows[s.category] = row;
    std::snprintf(buf, sizeof buf, R"(,
{"ph":"M","pid":%d,"tid":%d,"name":"thread_name","args":{"name":)", pid, row);
    out += buf + json_string(s.category) + "}}";
  }
  for (const TimelineSpan& s : spans_) {
    const int row = thread_of(s.category) < kFirstExtraRow ? thread_of(s.category) : extra_rows.at(s.category);
    std::snprintf(buf, sizeof buf, R"(,
{"ph":"X","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"cat":)", pid, row, s.start_us, s.duration_us);
    out += buf + json_string(s.category) + ",\"name\":" + json_string(s.name) +
           ",\"args\":{\"iteration\":" + std::to_string(s.iteration) + "}}";
  }
  return out + "\n]\n";
}

}  // namespace megatron
