// SnapshotStager: the host side of an asynchronous save (--async-save) -- reusable host buffers and the
// device-to-host copies into them, queued so that the training thread pays only for queuing them.
//
// stage() (training thread, right after the optimizer step whose state is saved):
//   - the host buffer is one allocation, made at the first stage() and sized to the pieces (pinned memory
//     from the context's pinned allocator for CUDA sources; plain host memory on a CPU context); later
//     stage() calls reuse it and reallocate only if the state grew;
//   - CUDA tensors: an event is recorded on ctx's stream (the state is final there), a dedicated copy stream
//     waits for it and runs one cudaMemcpyAsync per piece into the buffer, then records `copied`. The copy
//     engine works while the next iteration's forward and backward run on ctx's stream (they only read the
//     saved tensors). Nothing waits on the host.
//   - CPU tensors are copied right there (memcpy), so a CPU snapshot is complete when stage() returns.
// order_before_update(ctx) (training thread): makes ctx's stream wait for `copied` (cudaStreamWaitEvent, no
//   host wait). It must be queued before the first work that modifies a saved tensor -- the next optimizer
//   step (optim::AdamW::before_next_update runs it there). A no-op once done or when nothing is pending.
// wait_copies() (the writer thread): blocks until `copied` has completed, i.e. the host buffers hold the
//   snapshot. A CPU snapshot returns at once.
//
// Contract: the caller must not stage() again while anyone still reads the previous snapshot's buffers
// (AsyncSaver finalizes the previous save first). The stager must outlive every snapshot it returned.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "megatron/checkpoint/shard_writer.h"

namespace megatron::checkpoint {

class SnapshotStager {
 public:
  SnapshotStager();
  ~SnapshotStager();
  SnapshotStager(const SnapshotStager&) = delete;
  SnapshotStager& operator=(const SnapshotStager&) = delete;

  // Where the training thread's time went in the last stage().
  struct Timing {
    double allocate_seconds = 0;  // growing the host buffer (the first save; 0 afterwards)
    double enqueue_seconds = 0;   // queuing the device-to-host copies (or, on a CPU context, doing them)
    uint64_t bytes = 0;           // bytes staged (replica-0 pieces)
    uint64_t allocated_bytes = 0; // the buffer's size after this call
  };

  // Replica-0 pieces of `items` (validated as snapshot() does) into the reusable buffer; see above.
  HostSnapshot stage(Context& ctx, int rank, const std::vector<SaveItem>& items);
  void order_before_update(Context& ctx);
  void wait_copies();
  const Timing& last_timing() const { return timing_; }
  uint64_t capacity() const { return capacity_; }

 private:
  Tensor buffer_;  // U8 [capacity_], pinned for CUDA sources
  uint64_t capacity_ = 0;
  Timing timing_;
  struct Cuda;  // copy stream and events (CUDA builds)
  std::unique_ptr<Cuda> cuda_;
  bool pending_order_ = false;  // copies queued that ctx's stream has not been ordered after yet
};

}  // namespace megatron::checkpoint
