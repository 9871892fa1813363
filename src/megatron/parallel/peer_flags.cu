#include "megatron/parallel/peer_flags.h"

#include "megatron/core/cuda_check.h"

namespace megatron::parallel {

namespace {

__global__ void wait_at_least_kernel(const volatile unsigned long long* word, unsigned long long value) {
  while (*word < value) __nanosleep(100);
  __threadfence_system();  // what the raiser wrote before its store is visible to the work queued after us
}

__global__ void raise_kernel(volatile unsigned long long* word, unsigned long long value) {
  __threadfence_system();  // the stream's earlier writes (copies into the peer's slot) land before the flag
  *word = value;
}

}  // namespace

void enqueue_wait_at_least(cudaStream_t stream, const uint64_t* word, uint64_t value) {
  wait_at_least_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const volatile unsigned long long*>(word), value);
  CUDA_CHECK_LAUNCH("wait_at_least_kernel");
}

void enqueue_raise(cudaStream_t stream, uint64_t* word, uint64_t value) {
  raise_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<volatile unsigned long long*>(word), value);
  CUDA_CHECK_LAUNCH("raise_kernel");
}

}  // namespace megatron::parallel
