// Progress: a tqdm-style progress line for long work outside training -- preprocessing, index building,
// checkpoint conversion and loading -- for the users who watch a terminal:
//   building the sample index:  45%|#########           | 4500/10000 samples [00:12<00:15, 375.00 samples/s]
// (tqdm's layout: what, percent, bar, count, elapsed < remaining, rate; without a known total only the count,
// elapsed time and rate). On a terminal the line is redrawn in place (carriage return) at most every 0.1 s and
// ends with a newline when the work is done. Where the stream is not a terminal (a log file, CI) it is quiet,
// unless MEGATRON_PROGRESS=1 asks for it: then a full line every 10 s and at the end. MEGATRON_PROGRESS=0
// silences it on a terminal too.
//
// advance() and update() may be called from several threads and cost an atomic add and a clock read when
// nothing is drawn (tight loops call them once per batch of work); done() (or the destructor) draws the final
// line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace megatron {

class Progress {
 public:
  // `total` 0: unknown. `unit`: what is counted ("samples", "MB", "tensors").
  Progress(std::string what, int64_t total, std::string unit, std::FILE* stream = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t n = 1);
  void update(int64_t done);  // the absolute count
  void done();
  bool active() const { return mode_ != Mode::Quiet; }

 private:
  enum class Mode { Quiet, Terminal, Lines };
  void maybe_draw(int64_t done);
  void draw(int64_t done, bool final);

  std::string what_, unit_;
  int64_t total_ = 0;
  std::FILE* stream_ = nullptr;
  Mode mode_ = Mode::Quiet;
  std::chrono::steady_clock::time_point start_;
  // When the line was last drawn (steady-clock ticks): read by every caller, so atomic.
  std::atomic<std::chrono::steady_clock::rep> last_draw_{0};
  std::atomic<int64_t> done_{0};
  std::mutex draw_mutex_;
  bool finished_ = false;
};

// The line for `done` of `total` (0: unknown) `unit` after `elapsed` seconds, tqdm's layout; `bar_width`
// characters of bar.
std::string format_progress(const std::string& what, int64_t done, int64_t total, const std::string& unit,
                            double elapsed, int bar_width = 20);

}  // namespace megatron
