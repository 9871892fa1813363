// GpuActivity on CUPTI's activity API (gpu_activity.h). CUPTI hands records over in buffers it asks for and
// returns through two plain function pointers, with no user data: the buffers and the parsed records therefore
// live in one process-wide registry, which is also why only one GpuActivity may exist at a time.
#include <cupti.h>
#include <cxxabi.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "megatron/core/error.h"
#include "megatron/runtime/gpu_activity.h"

namespace megatron {
namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;  // CUPTI's own default; a buffer holds ~50k kernel records
constexpr size_t kBufferAlign = 8;                // CUPTI's required alignment of record buffers

struct Registry {
  std::mutex mutex;
  std::vector<GpuActivityRecord> completed;  // parsed from the buffers CUPTI returned, not yet taken
  uint64_t dropped = 0;
  bool owned = false;       // a GpuActivity exists
  bool registered = false;  // the callbacks are registered (once per process: CUPTI keeps them)
};

Registry& registry() {
  static Registry r;  // process-wide because CUPTI's callbacks are (see the file comment)
  return r;
}

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  MEGATRON_FAIL("CUPTI ", what, ": ", text ? text : "unknown error", " (", int(result), ")");
}

// The host's steady clock, which Timeline uses too; CUPTI stamps every record with it.
uint64_t CUPTIAPI steady_now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

std::string demangled(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

const char* copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

double us(uint64_t ns) { return double(ns) / 1000.0; }

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<GpuActivityRecord> parsed;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    GpuActivityRecord r;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      r = {GpuActivityRecord::Kind::Kernel, demangled(k->name), k->streamId, us(k->start), us(k->end), 0};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      r = {GpuActivityRecord::Kind::Copy, copy_name(c->copyKind), c->streamId, us(c->start), us(c->end), c->bytes};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
      r = {GpuActivityRecord::Kind::Copy, "memcpy PtoP", c->streamId, us(c->start), us(c->end), c->bytes};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      r = {GpuActivityRecord::Kind::Memset, "memset", m->streamId, us(m->start), us(m->end), m->bytes};
    } else {
      continue;
    }
    parsed.push_back(std::move(r));
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  std::free(buffer);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.completed.insert(reg.completed.end(), std::make_move_iterator(parsed.begin()),
                       std::make_move_iterator(parsed.end()));
  reg.dropped += dropped;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

bool GpuActivity::available() { return true; }

GpuActivity::GpuActivity() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  MEGATRON_CHECK(!reg.owned, "GpuActivity: CUPTI's activity records belong to the process; one recorder at a time");
  if (!reg.registered) {
    // The clock first: CUPTI takes it only before any activity kind is enabled.
    check(cuptiActivityRegisterTimestampCallback(steady_now_ns), "registering the timestamp clock");
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "registering the buffer callbacks");
    reg.registered = true;
  }
  reg.owned = true;
  reg.completed.clear();
  reg.dropped = 0;
}

GpuActivity::~GpuActivity() {
  if (enabled_) disable();
  cuptiActivityFlushAll(1);  // hand back CUPTI's partly filled buffers so nothing leaks into the next recorder
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.completed.clear();
  reg.owned = false;
}

void GpuActivity::enable() {
  if (enabled_) return;
  for (CUpti_ActivityKind kind : kKinds) check(cuptiActivityEnable(kind), "enabling kernel/copy records");
  enabled_ = true;
}

void GpuActivity::disable() {
  if (!enabled_) return;
  for (CUpti_ActivityKind kind : kKinds) check(cuptiActivityDisable(kind), "disabling kernel/copy records");
  enabled_ = false;
}

std::vector<GpuActivityRecord> GpuActivity::take() {
  // Flag 1 (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED): also the buffers not yet full, i.e. everything completed so far.
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing the activity buffers");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<GpuActivityRecord> out = std::move(reg.completed);
  reg.completed.clear();
  dropped_ = reg.dropped;
  return out;
}

}  // namespace megatron
