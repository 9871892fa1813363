// Timers: Megatron's named timers (megatron/core/timers.py) on one rank. Each named timer adds up the time
// spent between its start() and stop() until it is read and reset (every --log-interval); the report over
// the ranks (min/max, Megatron's strings) is trainer/timer_report.h's.
//
// Levels (--timing-log-level): a call site names its timer's level; a timer above the run's level is not
// started (one comparison), so level 0 -- the default -- costs nothing measurable: Megatron's level 1 timers
// run once per iteration (forward-backward, optimizer, ...), level 2 ones once per micro-batch
// (forward-compute, backward-compute, batch-generator, pipeline sends and receives).
//
// Clocks: Device timers (the default) measure the work queued on ctx's stream between start and stop: on a
// GPU a pair of CUDA timing events recorded on the stream, resolved by collect() once the stream has been
// synchronised (the training loop synchronises once per iteration anyway), so timing adds no host
// synchronisation; on the CPU, where ops finish inside their calls, the host clock. Host timers measure the
// host's own work (preparing a batch) with the host clock on every device.
//
// A Timers object belongs to one rank and one Context; not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/runtime/context.h"

namespace megatron {

enum class TimerClock { Device, Host };

class Timers {
 public:
  Timers(Context& ctx, int log_level);
  ~Timers();
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  int log_level() const { return log_level_; }
  bool enabled(int level) const { return level <= log_level_; }
  // Starts timer `name` (created at its first start) when `level` <= the log level; otherwise does nothing. A
  // timer that is running when started again is an error (Megatron's "timer has already been started").
  void start(std::string_view name, int level, TimerClock clock = TimerClock::Device);
  // Stops a running timer; does nothing for a timer that was not started (its level was above the log level).
  void stop(std::string_view name);
  // Resolves the device intervals recorded so far; ctx's stream must have been synchronised since they were
  // recorded. Called before reading.
  void collect();
  // Seconds timer `name` has accumulated since the last reset (0 for a timer never started).
  double elapsed_seconds(std::string_view name) const;
  // Every timer back to zero (running ones keep running).
  void reset();

 private:
  struct Timer;
  Timer* find(std::string_view name);
  const Timer* find(std::string_view name) const;

  Context& ctx_;
  int log_level_ = 0;
  std::vector<std::unique_ptr<Timer>> timers_;
  struct Device;  // CUDA event pool (CUDA builds on a GPU context)
  std::unique_ptr<Device> device_;
};

// RAII: timer `name` at `level` from construction to destruction (timers may be null: nothing).
class TimerScope {
 public:
  TimerScope(Timers* timers, std::string_view name, int level, TimerClock clock = TimerClock::Device)
      : timers_(timers && timers->enabled(level) ? timers : nullptr), name_(name) {
    if (timers_) timers_->start(name_, level, clock);
  }
  ~TimerScope() {
    if (timers_) timers_->stop(name_);
  }
  TimerScope(const TimerScope&) = delete;
  TimerScope& operator=(const TimerScope&) = delete;

 private:
  Timers* timers_;
  std::string_view name_;
};

}  // namespace megatron
