#include "megatron/parallel/stream_fork.h"

#if MEGATRON_WITH_CUDA
#include "megatron/core/cuda_check.h"
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron::parallel {

#if MEGATRON_WITH_CUDA
struct StreamFork::State {
  CudaStream side;
  CudaEvent forked, joined;
};

StreamFork::StreamFork(Context& ctx) {
  MEGATRON_CHECK(ctx.is_cuda(), "StreamFork: a side stream needs a CUDA context (got ", ctx.device(), ")");
  state_ = std::make_unique<State>();
}

StreamHandle StreamFork::fork(Context& ctx) {
  state_->forked.record(ctx.stream());
  state_->side.wait(state_->forked.get());
  return state_->side.get();
}

void StreamFork::join(Context& ctx) {
  state_->joined.record(state_->side.get());
  CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), state_->joined.get(), 0));
}
#else
struct StreamFork::State {};

StreamFork::StreamFork(Context& ctx) {
  MEGATRON_FAIL("StreamFork: this build has no CUDA backend (context on ", ctx.device(), ")");
}
StreamHandle StreamFork::fork(Context&) { return nullptr; }
void StreamFork::join(Context&) {}
#endif

StreamFork::~StreamFork() = default;

}  // namespace megatron::parallel
