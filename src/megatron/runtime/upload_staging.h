// UploadStaging: host tensors copied to the device through page-locked buffers, so that queueing an upload does
// not wait for the device. cudaMemcpyAsync from ordinary (pageable) host memory returns only once the stream has
// reached the copy, for all but small transfers: a host that prepares micro-batch m + 1 while the device runs
// micro-batch m stalls there, and a host timer around the upload (Megatron's batch-generator) counts the
// device's queue as data time.
//
// The buffers form a ring of `slots`. Each upload() takes the next slot: it waits until that slot's copies of
// `slots` uploads ago have run (the host is then that far ahead of the device; wait_for_free_slot() does that
// wait alone, so that a caller can keep it outside a timer), copies the host tensors into the slot's buffer and
// queues the copies to the device on ctx's stream. The host tensors may be reused as soon as upload() returns.
// A slot's buffer grows to the largest upload it has carried.
//
// On a CPU context upload() copies directly, nothing waits and no CUDA call is made (a CUDA build runs CPU ranks
// on machines without a driver).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "megatron/runtime/context.h"

namespace megatron {

class UploadStaging {
 public:
  struct Transfer {
    Tensor device;  // destination, on ctx's device
    Tensor host;    // source, in host memory of any kind; same dtype and number of elements
  };

  UploadStaging(Context& ctx, int slots);
  ~UploadStaging();  // waits for the copies still queued from its buffers
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // Blocks until the next slot's previous copies have run (returns at once when they have, or on a CPU context).
  void wait_for_free_slot();
  // Copies every transfer's host tensor to its device tensor through the next slot (see above).
  void upload(std::span<const Transfer> transfers);

 private:
  struct Slot;  // its page-locked buffer and the event after its last copies (upload_staging.cpp)
  Context& ctx_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;
};

}  // namespace megatron
