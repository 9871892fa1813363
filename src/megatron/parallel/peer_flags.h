// The two flag kernels under PeerExchange (peer_exchange.h): one thread each, queued on a stream.
// CUDA builds only.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace megatron::parallel {

// `stream` waits (a kernel spinning on the word, then a system-scope fence) until *word >= value. `word` is
// in this GPU's memory; another GPU raises it.
void enqueue_wait_at_least(cudaStream_t stream, const uint64_t* word, uint64_t value);
// After a system-scope fence (the stream's earlier copies and kernels are complete and visible), stores
// `value` to *word, which may be in another GPU's memory (a CUDA IPC mapping).
void enqueue_raise(cudaStream_t stream, uint64_t* word, uint64_t value);

}  // namespace megatron::parallel
