#include "megatron/runtime/gpu_activity_summary.h"

#include <algorithm>
#include <map>

namespace megatron {

double covered_time(std::vector<std::pair<double, double>> intervals, double lo, double hi) {
  for (auto& [s, e] : intervals) s = std::max(s, lo), e = std::min(e, hi);
  std::sort(intervals.begin(), intervals.end());
  double total = 0, run_start = 0, run_end = 0;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (e <= s) continue;
    if (open && s <= run_end) {
      run_end = std::max(run_end, e);
      continue;
    }
    if (open) total += run_end - run_start;
    run_start = s, run_end = e, open = true;
  }
  if (open) total += run_end - run_start;
  return total;
}

namespace {

// The longest stretch of [lo, hi) that no interval covers.
double longest_gap(std::vector<std::pair<double, double>> intervals, double lo, double hi) {
  std::sort(intervals.begin(), intervals.end());
  double reached = lo, gap = 0;
  for (const auto& [s, e] : intervals) {
    if (e <= lo || s >= hi || e <= s) continue;
    gap = std::max(gap, std::min(s, hi) - reached);
    reached = std::max(reached, std::min(e, hi));
  }
  return std::max(gap, hi - reached);
}

}  // namespace

GpuBusySummary summarize_gpu_activity(const std::vector<GpuActivityRecord>& records, double window_start_us,
                                      double window_end_us) {
  GpuBusySummary out;
  out.window_us = std::max(0.0, window_end_us - window_start_us);
  std::vector<std::pair<double, double>> intervals;
  std::map<std::string, GpuTimeByName> by_name;
  for (const GpuActivityRecord& r : records) {
    const double s = std::max(r.start_us, window_start_us), e = std::min(r.end_us, window_end_us);
    if (e <= s) continue;
    intervals.emplace_back(s, e);
    (r.kind == GpuActivityRecord::Kind::Kernel ? out.kernels : out.copies) += 1;
    const std::string name = r.kind == GpuActivityRecord::Kind::Kernel ? short_kernel_name(r.name) : r.name;
    GpuTimeByName& t = by_name[name];
    t.name = name;
    t.launches += 1;
    t.total_us += e - s;
  }
  out.busy_us = covered_time(intervals, window_start_us, window_end_us);
  out.longest_gap_us = out.window_us > 0 ? longest_gap(intervals, window_start_us, window_end_us) : 0.0;
  for (auto& [name, t] : by_name) out.by_name.push_back(std::move(t));
  std::stable_sort(out.by_name.begin(), out.by_name.end(),
                   [](const GpuTimeByName& a, const GpuTimeByName& b) { return a.total_us > b.total_us; });
  return out;
}

std::string short_kernel_name(const std::string& name) {
  // The parameter list is the first '(' outside template brackets; "(anonymous namespace)" is not one.
  size_t end = name.size();
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>' && depth > 0) --depth;
    if (c == '(' && depth == 0 && name.compare(i, 21, "(anonymous namespace)") != 0) {
      end = i;
      break;
    }
  }
  std::string s = name.substr(0, end);
  // The return type: everything before the last space outside template brackets (kernels return void).
  depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>' && depth > 0) --depth;
    if (s[i] == '(' && s.compare(i, 21, "(anonymous namespace)") == 0) i += 20;
    else if (s[i] == ' ' && depth == 0) start = i + 1;
  }
  s = s.substr(start);
  return s.size() > 100 ? s.substr(0, 97) + "..." : s;
}

}  // namespace megatron
