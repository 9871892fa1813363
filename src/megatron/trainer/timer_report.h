// Megatron's timer report (megatron/core/timers.py, Timers.log and Timers.write): every --log-interval the last
// rank prints, for the timers of --timing-log-level, the time per iteration across the ranks that recorded
// each one, as --timing-log-option says:
//   minmax (Megatron's default)   (min, max) time across ranks (ms):
//                                     forward-backward ...............................: (301.12, 305.77)
//   max                           max time across ranks (ms):
//                                     forward-backward ...............................: 305.77
//   all                           times across ranks (ms):
//                                   forward-backward:
//                                      rank  0: 301.12
// (names padded with dots to 48 characters, two decimals, as Megatron prints them). A timer no rank recorded
// is left out, and so is the whole report when none was. The timers of each level are Megatron's training_log
// list, in its order (megatron_timer_names); --log-timers-to-tensorboard writes each one's maximum over the
// ranks, in seconds per iteration, as "<name>-time".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/runtime/timers.h"

namespace megatron::trainer {

// Megatron's timers_to_log at `level` (0: none; 1: the once-per-iteration timers; 2: also the per-micro-batch
// ones), in Megatron's order.
std::vector<std::string> megatron_timer_names(int level);

struct TimerReport {
  std::string text;                                       // what the last rank prints; "" when nothing was timed
  std::vector<std::pair<std::string, double>> max_seconds;  // per timer recorded: max over ranks, s / iteration
};

// Collective over `world`: reads every rank's `names` (seconds accumulated, after Timers::collect) divided by
// `iterations`; `option` is max, minmax or all. Does not reset the timers.
TimerReport report_timers(const Timers& timers, comm::Communicator& world, const std::vector<std::string>& names,
                          const std::string& option, double iterations);

// The text of a report from each rank's milliseconds per iteration, times[rank][name] (0: not recorded).
std::string format_timer_report(const std::vector<std::string>& names, const std::vector<std::vector<double>>& times,
                                const std::string& option);

}  // namespace megatron::trainer
