// The CUDA streams and events of DistributedDataParallel (internal to distributed/): the communication stream its
// overlapped bucket reductions run on, and FSDP's collectives (fsdp.cpp), which all run on that stream in the
// order they are issued -- one stream per communicator, so the ranks' NCCL kernels meet in the same order -- each
// after the work ctx's stream has queued so far. CPU builds: empty.
#pragma once

#include <memory>
#include <vector>

#include "megatron/distributed/distributed_data_parallel.h"

#if MEGATRON_WITH_CUDA
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron::distributed {

#if MEGATRON_WITH_CUDA
struct DistributedDataParallel::Streams {
  CudaStream comm;
  CudaEvent ready, done;
  bool used = false;  // something was queued on `comm` this iteration (the bucketed reduction)

  // FSDP: events marking its collectives' completion on `comm`, from a pool (index into `events`).
  std::vector<std::unique_ptr<CudaEvent>> events;
  std::vector<int> free_events;
  int take_event() {
    if (free_events.empty()) {
      events.push_back(std::make_unique<CudaEvent>());
      return int(events.size()) - 1;
    }
    const int e = free_events.back();
    free_events.pop_back();
    return e;
  }
  void give_event(int e) { free_events.push_back(e); }
  // FSDP: a bucket's gradients reduce-scattered on `comm` and not yet added to its shard.
  struct Reduction {
    size_t buffer = 0, bucket = 0;
    Tensor grads;  // the whole bucket; this rank's chunk holds the reduced gradients once `event` has completed
    int event = -1;
  };
  std::vector<Reduction> reductions;
};
#else
struct DistributedDataParallel::Streams {};
#endif

}  // namespace megatron::distributed
