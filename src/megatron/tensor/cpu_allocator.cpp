#include <cstdlib>

#include "megatron/core/error.h"
#include "megatron/tensor/allocator.h"

namespace megatron {

void* CpuAllocator::allocate(size_t bytes, StreamHandle, std::source_location caller) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  MEGATRON_CHECK(p != nullptr, "host out of memory: requested ", bytes, " bytes for ", caller.function_name(), " (",
                 caller.file_name(), ":", caller.line(), "); allocated by this allocator: ", stats().allocated_bytes);
  std::lock_guard lock(mutex_);
  live_[p] = rounded;
  stats_.allocated_bytes += rounded;
  stats_.reserved_bytes += rounded;
  stats_.num_allocs++;
  stats_.num_driver_allocs++;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return p;
}

void CpuAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    MEGATRON_CHECK(it != live_.end(), "CpuAllocator::deallocate: pointer ", ptr, " was not allocated here");
    stats_.allocated_bytes -= it->second;
    stats_.reserved_bytes -= it->second;
    live_.erase(it);
  }
  std::free(ptr);
}

AllocatorStats CpuAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CpuAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace megatron
