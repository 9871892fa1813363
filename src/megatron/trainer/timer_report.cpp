#include "megatron/trainer/timer_report.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace megatron::trainer {
namespace {

constexpr double kNotRecorded = std::numeric_limits<double>::infinity();

// Python's '{}: ...'.format((name + ' ').ljust(48, '.')).
std::string dotted(const std::string& name) {
  std::string s = name + " ";
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

std::string two_decimals(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

// Megatron's _get_global_min_max_time_string: min over the ranks that recorded the timer (> 0), max over all.
std::string format_min_max(const std::vector<std::string>& names, const std::vector<double>& mins,
                           const std::vector<double>& maxs, bool max_only) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!(maxs[i] > 0.0)) continue;
    out += "\n    " + dotted(names[i]) + ": " +
           (max_only ? two_decimals(maxs[i]) : "(" + two_decimals(mins[i]) + ", " + two_decimals(maxs[i]) + ")");
  }
  if (out.empty()) return "";
  return (max_only ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):") + out;
}

// Megatron's _get_all_ranks_time_string.
std::string format_all(const std::vector<std::string>& names, const std::vector<std::vector<double>>& times) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    bool found = false;
    for (size_t r = 0; r < times.size(); ++r) {
      if (!(times[r][i] > 0.0)) continue;
      if (!found) out += "\n  " + names[i] + ":";
      found = true;
      char buf[64];
      std::snprintf(buf, sizeof buf, "\n     rank %2d: %.2f", int(r), times[r][i]);
      out += buf;
    }
  }
  return out.empty() ? "" : "times across ranks (ms):" + out;
}

// Each name's min (over recording ranks; kNotRecorded when none) and max over the rows of `times`.
void min_max_of(const std::vector<std::vector<double>>& times, size_t n, std::vector<double>& mins,
                std::vector<double>& maxs) {
  mins.assign(n, kNotRecorded);
  maxs.assign(n, 0.0);
  for (const std::vector<double>& row : times)
    for (size_t i = 0; i < n; ++i)
      if (row[i] > 0.0) mins[i] = std::min(mins[i], row[i]), maxs[i] = std::max(maxs[i], row[i]);
}

}  // namespace

std::vector<std::string> megatron_timer_names(int level) {
  std::vector<std::string> names;
  if (level >= 1)
    names = {"forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
             "params-all-gather", "optimizer-copy-to-main-grad", "optimizer-unscale-and-check-inf",
             "optimizer-clip-main-grad", "optimizer-count-zeros", "optimizer-inner-step",
             "optimizer-copy-main-to-model-params", "optimizer"};
  if (level >= 2)
    for (const char* n : {"batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
                          "backward-recv", "backward-send", "forward-send-forward-recv", "forward-send-backward-recv",
                          "backward-send-forward-recv", "backward-send-backward-recv",
                          "forward-backward-send-forward-backward-recv",
                          // Ours, after Megatron's: the MoE alltoall dispatcher's exchanges (AllToAllPlan).
                          "moe-tokens-per-expert", "moe-dispatch-all-to-all", "moe-combine-all-to-all"})
      names.push_back(n);
  return names;
}

std::string format_timer_report(const std::vector<std::string>& names, const std::vector<std::vector<double>>& times,
                                const std::string& option) {
  if (option == "all") return format_all(names, times);
  std::vector<double> mins, maxs;
  min_max_of(times, names.size(), mins, maxs);
  return format_min_max(names, mins, maxs, option == "max");
}

TimerReport report_timers(const Timers& timers, comm::Communicator& world, const std::vector<std::string>& names,
                          const std::string& option, double iterations) {
  const size_t n = names.size();
  std::vector<double> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = 1e3 * timers.elapsed_seconds(names[i]) / std::max(iterations, 1.0);
  TimerReport report;
  std::vector<double> mins(n), maxs(n);
  if (option == "all") {  // every rank's row (a sum of rows that are zero but on their own rank)
    std::vector<double> table(n * size_t(world.size()), 0.0);
    std::copy(mine.begin(), mine.end(), table.begin() + std::ptrdiff_t(n * size_t(world.rank())));
    world.all_reduce_host(table, comm::ReduceOp::Sum);
    std::vector<std::vector<double>> times(size_t(world.size()));
    for (size_t r = 0; r < times.size(); ++r) times[r].assign(table.begin() + std::ptrdiff_t(r * n),
                                                              table.begin() + std::ptrdiff_t((r + 1) * n));
    report.text = format_all(names, times);
    min_max_of(times, n, mins, maxs);
  } else {  // one all-reduce: max of the times and of their negated values (min over recording ranks)
    std::vector<double> both(2 * n);
    for (size_t i = 0; i < n; ++i) both[i] = mine[i], both[n + i] = mine[i] > 0.0 ? -mine[i] : -kNotRecorded;
    world.all_reduce_host(both, comm::ReduceOp::Max);
    for (size_t i = 0; i < n; ++i) maxs[i] = both[i], mins[i] = -both[n + i];
    report.text = format_min_max(names, mins, maxs, option == "max");
  }
  for (size_t i = 0; i < n; ++i)
    if (maxs[i] > 0.0) report.max_seconds.emplace_back(names[i], maxs[i] / 1e3);
  return report;
}

}  // namespace megatron::trainer
