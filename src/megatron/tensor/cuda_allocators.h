// Device memory (CudaCachingAllocator) and page-locked host memory (PinnedHostAllocator), both cached by
// CachingPool (see caching_pool.h for the reuse contract). Only in CUDA builds.
#pragma once

#include "megatron/tensor/caching_pool.h"

namespace megatron {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device_index);
  // Throws megatron::Error on out-of-memory, stating requested, free and reserved bytes and the caller.
  void* allocate(size_t bytes, StreamHandle stream, std::source_location caller) override;
  void deallocate(void* ptr) override { pool_.deallocate(ptr); }
  Device device() const override { return Device::cuda(device_index_); }
  AllocatorStats stats() const override { return pool_.stats(); }
  void reset_peak_stats() override { pool_.reset_peak_stats(); }
  void empty_cache() override { pool_.release_cache(); }

 private:
  int device_index_;
  CachingPool pool_;
};

class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator();
  void* allocate(size_t bytes, StreamHandle stream, std::source_location caller) override;
  void deallocate(void* ptr) override { pool_.deallocate(ptr); }
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override { return pool_.stats(); }
  void reset_peak_stats() override { pool_.reset_peak_stats(); }
  void empty_cache() override { pool_.release_cache(); }

 private:
  CachingPool pool_;
};

}  // namespace megatron
