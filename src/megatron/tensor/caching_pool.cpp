#include "megatron/tensor/caching_pool.h"

#include <algorithm>
#include <bit>

#include "megatron/core/error.h"

namespace megatron {

CachingPool::~CachingPool() {
  std::lock_guard lock(mutex_);
  release_cache_locked();
  // Live blocks at destruction belong to tensors that outlived their allocator; free them anyway.
  for (auto& [ptr, block] : live_) backend_.raw_free(ptr);
}

size_t CachingPool::size_class(size_t bytes) {
  constexpr size_t kSmall = 1 << 20;
  constexpr size_t kLarge = size_t(1) << 30;
  if (bytes == 0) return 512;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  size_t pow2 = std::bit_floor(bytes);  // 2^k <= bytes < 2^(k+1)
  // Blocks of 1 GiB and more are the model state (parameter, gradient and optimizer buffers) and the logits:
  // few, long-lived, of sizes that rarely recur, so quarter steps would only waste up to a quarter of the
  // largest allocations; they step by 2^k / 64 instead (at most 1.6% waste).
  size_t step = pow2 >= kLarge ? pow2 / 64 : pow2 / 4;
  return (bytes + step - 1) / step * step;
}

void* CachingPool::allocate(size_t bytes, StreamHandle stream) {
  size_t rounded = size_class(bytes);
  std::lock_guard lock(mutex_);
  stats_.num_allocs++;
  void* p = allocate_locked(rounded, stream);
  if (p == nullptr) {
    backend_.before_release();
    release_cache_locked();
    p = backend_.raw_alloc(rounded);
    if (p == nullptr) return nullptr;
    stats_.num_ooms_recovered++;
    stats_.num_driver_allocs++;
    stats_.reserved_bytes += rounded;
  }
  live_[p] = Block{rounded, stream};
  stats_.allocated_bytes += rounded;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return p;
}

void* CachingPool::allocate_locked(size_t rounded, StreamHandle stream) {
  auto it = cached_.find({stream, rounded});
  if (it != cached_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.num_cache_hits++;
    return p;
  }
  void* p = backend_.raw_alloc(rounded);
  if (p != nullptr) {
    stats_.num_driver_allocs++;
    stats_.reserved_bytes += rounded;
  }
  return p;
}

void CachingPool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  MEGATRON_CHECK(it != live_.end(), "caching allocator: free of pointer ", ptr, " that it did not allocate");
  Block b = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= b.size;
  cached_[{b.stream, b.size}].push_back(ptr);
}

void CachingPool::release_cache() {
  std::lock_guard lock(mutex_);
  backend_.before_release();
  release_cache_locked();
}

void CachingPool::release_cache_locked() {
  for (auto& [key, ptrs] : cached_) {
    for (void* p : ptrs) {
      backend_.raw_free(p);
      stats_.reserved_bytes -= key.second;
    }
  }
  cached_.clear();
}

AllocatorStats CachingPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingPool::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace megatron
