// The CUDA streams and events of AdamW's overlapped offload transfers (internal to optim/; adamw.h): gradients
// copy to pinned host memory on one stream and updated parameters copy back on another, so a copy in one direction
// never waits behind a copy in the other, and neither waits behind ctx's stream, which meanwhile updates the
// entries kept on the device. CPU builds: empty.
#pragma once

#include <memory>
#include <vector>

#include "megatron/optim/adamw.h"

#if MEGATRON_WITH_CUDA
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron::optim {

#if MEGATRON_WITH_CUDA
struct AdamW::TransferStreams {
  CudaStream to_host, to_device;
  CudaEvent ready;            // recorded where gradients become final; the copy streams wait for it
  CudaEvent to_host_done;     // join_gradient_prefetches: everything queued on to_host so far
  CudaEvent to_device_done;   // step(): every parameter copied back; ctx's stream waits for it
  std::vector<std::unique_ptr<CudaEvent>> copied;  // per entry: its gradient is in host memory

  explicit TransferStreams(size_t entries) {
    for (size_t i = 0; i < entries; ++i) copied.push_back(std::make_unique<CudaEvent>());
  }
};
#else
struct AdamW::TransferStreams {
  explicit TransferStreams(size_t) {}
};
#endif

}  // namespace megatron::optim
