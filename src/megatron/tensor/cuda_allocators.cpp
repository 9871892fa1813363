#include "megatron/tensor/cuda_allocators.h"

#include "megatron/core/cuda_check.h"

namespace megatron {
namespace {

std::string gib(size_t bytes) { return str_cat(bytes, " bytes (", double(bytes) / double(1ull << 30), " GiB)"); }

}  // namespace

CudaCachingAllocator::CudaCachingAllocator(int device_index)
    : device_index_(device_index),
      pool_(PoolBackend{
          .raw_alloc =
              [device_index](size_t bytes) -> void* {
                void* p = nullptr;
                CUDA_CHECK(cudaSetDevice(device_index));
                cudaError_t status = cudaMalloc(&p, bytes);
                if (status == cudaErrorMemoryAllocation) {
                  (void)cudaGetLastError();  // clear the sticky-free error so later checks are not confused
                  return nullptr;
                }
                CUDA_CHECK_MSG(status, " (cudaMalloc of ", bytes, " bytes on cuda:", device_index, ")");
                return p;
              },
          .raw_free = [](void* p) { CUDA_CHECK(cudaFree(p)); },
          .before_release = [device_index] { CUDA_CHECK(cudaDeviceSynchronize()); },
      }) {}

void* CudaCachingAllocator::allocate(size_t bytes, StreamHandle stream, std::source_location caller) {
  void* p = pool_.allocate(bytes, stream);
  if (p != nullptr) return p;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  AllocatorStats s = pool_.stats();
  MEGATRON_FAIL("CUDA out of memory on cuda:", device_index_, ": requested ", gib(bytes), " (size class ",
                CachingPool::size_class(bytes), ") for ", caller.function_name(), " at ", caller.file_name(), ":",
                caller.line(), "; free on the device ", gib(free_bytes), " of ", gib(total_bytes),
                "; this allocator holds ", gib(s.allocated_bytes), " in live tensors and ", gib(s.reserved_bytes),
                " reserved (its cache was already released and the request retried)");
}

PinnedHostAllocator::PinnedHostAllocator()
    : pool_(PoolBackend{
          .raw_alloc =
              [](size_t bytes) -> void* {
                void* p = nullptr;
                cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
                if (status == cudaErrorMemoryAllocation) {
                  (void)cudaGetLastError();
                  return nullptr;
                }
                CUDA_CHECK_MSG(status, " (cudaHostAlloc of ", bytes, " bytes)");
                return p;
              },
          .raw_free = [](void* p) { CUDA_CHECK(cudaFreeHost(p)); },
      }) {}

void* PinnedHostAllocator::allocate(size_t bytes, StreamHandle stream, std::source_location caller) {
  void* p = pool_.allocate(bytes, stream);
  if (p != nullptr) return p;
  AllocatorStats s = pool_.stats();
  MEGATRON_FAIL("pinned host memory exhausted: requested ", gib(bytes), " for ", caller.function_name(), " at ",
                caller.file_name(), ":", caller.line(), "; this allocator holds ", gib(s.allocated_bytes),
                " live and ", gib(s.reserved_bytes), " reserved");
}

}  // namespace megatron
