// What the GPU did with an iteration's wall time, from GpuActivity's records (gpu_activity.h): the share of
// the time in which anything ran (busy), the longest stretch in which nothing did, and the time by kernel name.
// Busy time counts overlapping work once (two streams running at once are busy once); the per-name totals
// count each launch's own duration, so they may add up to more than the busy time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "megatron/runtime/gpu_activity.h"

namespace megatron {

struct GpuTimeByName {
  std::string name;  // short_kernel_name() of the kernels; "memcpy DtoH", "memset" for the others
  int64_t launches = 0;
  double total_us = 0;
};

struct GpuBusySummary {
  double window_us = 0;       // the window's length
  double busy_us = 0;         // time inside the window in which at least one record ran
  double longest_gap_us = 0;  // the longest stretch inside the window with nothing running
  int64_t kernels = 0, copies = 0;
  std::vector<GpuTimeByName> by_name;  // largest total first
  double busy_fraction() const { return window_us > 0 ? busy_us / window_us : 0.0; }
};

// The length of the union of [start, end) intervals, clipped to [lo, hi).
double covered_time(std::vector<std::pair<double, double>> intervals, double lo, double hi);

// The summary of the records inside [window_start_us, window_end_us) (records are clipped to it).
GpuBusySummary summarize_gpu_activity(const std::vector<GpuActivityRecord>& records, double window_start_us,
                                      double window_end_us);

// A kernel's name for a table: the demangled name without its return type and parameter list, at most 100
// characters ("void ns::kernel<float>(float*, int)" -> "ns::kernel<float>").
std::string short_kernel_name(const std::string& name);

}  // namespace megatron
