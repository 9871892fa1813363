#include "megatron/runtime/timers.h"

#include <chrono>
#include <utility>

#include "megatron/core/error.h"

#if MEGATRON_WITH_CUDA
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron {
namespace {

double host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

#if MEGATRON_WITH_CUDA
// Timing events, reused: an interval's pair goes back to the pool once collect() has read it.
struct Timers::Device {
  std::vector<std::unique_ptr<CudaEvent>> free;
  std::unique_ptr<CudaEvent> take() {
    if (free.empty()) return std::make_unique<CudaEvent>(true);
    std::unique_ptr<CudaEvent> e = std::move(free.back());
    free.pop_back();
    return e;
  }
};
struct Timers::Timer {
  std::string name;
  bool running = false;
  TimerClock clock = TimerClock::Device;
  double host_start = 0, seconds = 0;
  std::unique_ptr<CudaEvent> start;  // of the running device interval
  std::vector<std::pair<std::unique_ptr<CudaEvent>, std::unique_ptr<CudaEvent>>> pending;  // recorded, not read
};
#else
struct Timers::Device {};
struct Timers::Timer {
  std::string name;
  bool running = false;
  TimerClock clock = TimerClock::Device;
  double host_start = 0, seconds = 0;
};
#endif

Timers::Timers(Context& ctx, int log_level) : ctx_(ctx), log_level_(log_level) {
#if MEGATRON_WITH_CUDA
  if (ctx.is_cuda()) device_ = std::make_unique<Device>();
#endif
}

Timers::~Timers() = default;

Timers::Timer* Timers::find(std::string_view name) {
  for (const std::unique_ptr<Timer>& t : timers_)
    if (t->name == name) return t.get();
  return nullptr;
}

const Timers::Timer* Timers::find(std::string_view name) const {
  for (const std::unique_ptr<Timer>& t : timers_)
    if (t->name == name) return t.get();
  return nullptr;
}

void Timers::start(std::string_view name, int level, TimerClock clock) {
  if (level > log_level_) return;
  Timer* t = find(name);
  if (t == nullptr) {
    timers_.push_back(std::make_unique<Timer>());
    t = timers_.back().get();
    t->name = std::string(name);
  }
  MEGATRON_CHECK(!t->running, "timer '", name, "' has already been started");
  t->running = true;
  t->clock = device_ ? clock : TimerClock::Host;
  if (t->clock == TimerClock::Host) {
    t->host_start = host_seconds();
    return;
  }
#if MEGATRON_WITH_CUDA
  t->start = device_->take();
  t->start->record(ctx_.stream());
#endif
}

void Timers::stop(std::string_view name) {
  Timer* t = find(name);
  if (t == nullptr || !t->running) return;
  t->running = false;
  if (t->clock == TimerClock::Host) {
    t->seconds += host_seconds() - t->host_start;
    return;
  }
#if MEGATRON_WITH_CUDA
  std::unique_ptr<CudaEvent> end = device_->take();
  end->record(ctx_.stream());
  t->pending.emplace_back(std::move(t->start), std::move(end));
#endif
}

void Timers::collect() {
#if MEGATRON_WITH_CUDA
  if (!device_) return;
  for (const std::unique_ptr<Timer>& t : timers_) {
    for (auto& [start, end] : t->pending) {
      t->seconds += 1e-3 * double(end->elapsed_ms_since(*start));
      device_->free.push_back(std::move(start));
      device_->free.push_back(std::move(end));
    }
    t->pending.clear();
  }
#endif
}

double Timers::elapsed_seconds(std::string_view name) const {
  const Timer* t = find(name);
  return t ? t->seconds : 0.0;
}

void Timers::reset() {
  for (const std::unique_ptr<Timer>& t : timers_) t->seconds = 0;
}

}  // namespace megatron
