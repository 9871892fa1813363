// StreamFork: a side CUDA stream for collectives that overlap computation (tensor parallelism: the input-
// gradient all-reduce / reduce-scatter while the weight-gradient GEMM runs, the all-gather of a saved input
// while the input-gradient GEMM runs).
//
//   StreamHandle side = fork.fork(ctx);   // the side stream waits for everything queued on ctx's stream so far
//   comm.all_reduce(t, Sum, side);        // queued behind that; ctx's stream goes on computing
//   ...                                    // more work on ctx's stream runs concurrently
//   fork.join(ctx);                       // ctx's stream waits for everything queued on the side stream so far
//
// Tensors used on the side stream must stay alive (host handles) until join() has been called: memory the
// caching allocator hands out afterwards is used by work queued after the join, so it cannot race.
// Collectives of one communicator still run in issue order (NcclCommunicator serialises on its own stream).
// CUDA contexts only; on CPU ranks collectives complete inside the call and there is nothing to fork.
#pragma once

#include <memory>

#include "megatron/runtime/context.h"

namespace megatron::parallel {

class StreamFork {
 public:
  // Throws on a CPU context or a build without CUDA.
  explicit StreamFork(Context& ctx);
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  StreamHandle fork(Context& ctx);
  void join(Context& ctx);

 private:
  struct State;  // stream and events (CUDA builds)
  std::unique_ptr<State> state_;
};

}  // namespace megatron::parallel
