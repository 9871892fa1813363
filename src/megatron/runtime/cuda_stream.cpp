#include "megatron/runtime/cuda_stream.h"

#include "megatron/core/cuda_check.h"

namespace megatron {

CudaStream::CudaStream(int priority) {
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}
CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}
void CudaStream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
void CudaStream::wait(cudaEvent_t event) const { CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0)); }

CudaEvent::CudaEvent(bool timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}
void CudaEvent::record(cudaStream_t stream) const { CUDA_CHECK(cudaEventRecord(event_, stream)); }
void CudaEvent::synchronize() const { CUDA_CHECK(cudaEventSynchronize(event_)); }
bool CudaEvent::query() const {
  cudaError_t s = cudaEventQuery(event_);
  if (s == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  CUDA_CHECK(s);
  return true;
}
float CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace megatron
