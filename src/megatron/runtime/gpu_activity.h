// GpuActivity: the GPU's own record of what it ran -- every kernel, copy and memset, with its stream and its
// start and end -- collected through CUPTI's activity API while enabled. It is what --use-pytorch-profiler
// (Megatron's switch for a kernel-level trace, there recorded by PyTorch's profiler through the same CUPTI)
// adds to the timeline: one row per CUDA stream under the rank's spans, and the busy/idle figures of
// gpu_activity_summary.h. Unlike events around spans it shows the gaps between kernels, under the clocks the
// run actually had (a kernel timed alone by Nsight Compute runs unthrottled).
//
// CUPTI's activity buffers belong to the process, so at most one GpuActivity may exist at a time (checked).
// Timestamps are the host's steady clock in microseconds, the clock Timeline uses, so the kernel rows line up
// with the host-timed spans of the same trace. Timeline's event-timed GPU spans are placed as if the GPU began
// the iteration when the host did; where the GPU was still behind, those spans sit earlier than the kernel
// rows, which carry the true times. Builds without CUPTI have available() false and refuse to
// construct one, with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

struct GpuActivityRecord {
  enum class Kind { Kernel, Copy, Memset };
  Kind kind = Kind::Kernel;
  std::string name;   // the kernel's demangled name; "memcpy DtoH" and the like for copies; "memset"
  uint32_t stream = 0;  // CUPTI's stream id (distinct per stream of the context)
  double start_us = 0, end_us = 0;
  uint64_t bytes = 0;  // copies and memsets
};

class GpuActivity {
 public:
  // Whether this build can record (it found CUPTI).
  static bool available();

  GpuActivity();  // registers with CUPTI; records nothing until enable()
  ~GpuActivity();
  GpuActivity(const GpuActivity&) = delete;
  GpuActivity& operator=(const GpuActivity&) = delete;

  // Starts/stops recording kernels, copies and memsets of every stream of this process.
  void enable();
  void disable();
  // The records completed since the last call, in CUPTI's delivery order. Call after synchronising the streams
  // whose work should be included (work still running is delivered by a later call). Records CUPTI dropped for
  // lack of buffer space are counted in dropped().
  std::vector<GpuActivityRecord> take();
  uint64_t dropped() const { return dropped_; }

 private:
  bool enabled_ = false;
  uint64_t dropped_ = 0;
};

}  // namespace megatron
