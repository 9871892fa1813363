// The caching logic shared by the CUDA device allocator and the pinned host allocator, independent of
// where the bytes come from (so it is unit-tested on CPU with a fake backend).
//
// Contract:
// - Requests are rounded to a size class: multiples of 512 B below 1 MiB; above, the next of
//   {1, 1.25, 1.5, 1.75} x 2^k (at most 25% waste); from 1 GiB on, the next multiple of 2^k / 64 (at most
//   1.6%: the model state's buffers are that large and allocated once).
// - A freed block goes back to the cache of the stream it was allocated on and is reused only by a
//   request of the same size class on the same stream, so stream order keeps reuse safe without events.
//   A tensor used on another stream must be kept alive until that stream's work is known to be done.
// - When the backend reports out-of-memory, the whole cache is released and the request retried once;
//   if it still fails, OutOfMemory details go to the caller's error message.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "megatron/tensor/allocator.h"

namespace megatron {

struct PoolBackend {
  // Returns nullptr on out-of-memory (other failures throw).
  std::function<void*(size_t bytes)> raw_alloc;
  std::function<void(void* ptr)> raw_free;
  // Called before the cache is released to retry an allocation (e.g. device synchronize).
  std::function<void()> before_release = [] {};
};

class CachingPool {
 public:
  explicit CachingPool(PoolBackend backend) : backend_(std::move(backend)) {}
  ~CachingPool();

  static size_t size_class(size_t bytes);

  // nullptr when the backend is out of memory even after releasing the cache.
  void* allocate(size_t bytes, StreamHandle stream);
  void deallocate(void* ptr);
  void release_cache();
  AllocatorStats stats() const;
  void reset_peak_stats();

 private:
  void* allocate_locked(size_t rounded, StreamHandle stream);
  void release_cache_locked();

  struct Block {
    size_t size;
    StreamHandle stream;
  };
  PoolBackend backend_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<StreamHandle, size_t>, std::vector<void*>> cached_;
  AllocatorStats stats_;
};

}  // namespace megatron
