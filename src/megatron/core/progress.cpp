#include "megatron/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace megatron {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTerminalRedraw = std::chrono::milliseconds(100);
constexpr auto kLogLine = std::chrono::seconds(10);

// tqdm's time format: mm:ss, or h:mm:ss from an hour on.
std::string clock_time(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const auto s = static_cast<long long>(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

}  // namespace

std::string format_progress(const std::string& what, int64_t done, int64_t total, const std::string& unit,
                            double elapsed, int bar_width) {
  const double rate = elapsed > 0 ? double(done) / elapsed : 0.0;
  char rate_text[64];
  if (rate > 0) std::snprintf(rate_text, sizeof rate_text, "%.2f %s/s", rate, unit.c_str());
  else std::snprintf(rate_text, sizeof rate_text, "? %s/s", unit.c_str());
  if (total <= 0)
    return what + ": " + std::to_string(done) + " " + unit + " [" + clock_time(elapsed) + ", " + rate_text + "]";
  const double fraction = std::clamp(double(done) / double(total), 0.0, 1.0);
  const int filled = int(fraction * bar_width);
  char percent[16];
  std::snprintf(percent, sizeof percent, "%3.0f%%", 100.0 * fraction);
  const double remaining = rate > 0 ? double(std::max<int64_t>(total - done, 0)) / rate : -1.0;
  return what + ": " + percent + "|" + std::string(size_t(filled), '#') + std::string(size_t(bar_width - filled), ' ') +
         "| " + std::to_string(done) + "/" + std::to_string(total) + " " + unit + " [" + clock_time(elapsed) + "<" +
         clock_time(remaining) + ", " + rate_text + "]";
}

Progress::Progress(std::string what, int64_t total, std::string unit, std::FILE* stream)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), stream_(stream), start_(Clock::now()),
      last_draw_(start_.time_since_epoch().count()) {
  const char* env = std::getenv("MEGATRON_PROGRESS");
  const bool terminal = stream_ != nullptr && isatty(fileno(stream_));
  if (env != nullptr && std::strcmp(env, "0") == 0) mode_ = Mode::Quiet;
  else if (terminal) mode_ = Mode::Terminal;
  else if (env != nullptr && std::strcmp(env, "1") == 0) mode_ = Mode::Lines;
}

Progress::~Progress() { done(); }

void Progress::advance(int64_t n) {
  const int64_t now = done_.fetch_add(n, std::memory_order_relaxed) + n;
  if (mode_ != Mode::Quiet) maybe_draw(now);
}

void Progress::update(int64_t done) {
  done_.store(done, std::memory_order_relaxed);
  if (mode_ != Mode::Quiet) maybe_draw(done);
}

void Progress::maybe_draw(int64_t done) {
  const auto now = Clock::now();
  const Clock::time_point last{Clock::duration(last_draw_.load(std::memory_order_relaxed))};
  if (now - last < (mode_ == Mode::Terminal ? kTerminalRedraw : kLogLine)) return;
  std::unique_lock lock(draw_mutex_, std::try_to_lock);  // another thread is drawing: skip
  if (!lock.owns_lock() || finished_) return;
  last_draw_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  draw(done, false);
}

void Progress::draw(int64_t done, bool final) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const std::string line = format_progress(what_, done, total_, unit_, elapsed);
  if (mode_ == Mode::Terminal) std::fprintf(stream_, "\r%s\033[K%s", line.c_str(), final ? "\n" : "");
  else std::fprintf(stream_, "%s\n", line.c_str());
  std::fflush(stream_);
}

void Progress::done() {
  std::lock_guard lock(draw_mutex_);
  if (finished_) return;
  finished_ = true;
  if (mode_ != Mode::Quiet) draw(done_.load(), true);
}

}  // namespace megatron
