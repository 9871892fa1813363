// RAII wrappers for CUDA streams and events. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

namespace megatron {

class CudaStream {
 public:
  // A non-blocking stream (does not synchronise with the legacy default stream).
  explicit CudaStream(int priority = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const;
  void wait(cudaEvent_t event) const;  // later work on this stream waits for `event`

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  // timing = false makes a lighter event for pure ordering.
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true when the recorded work is done
  // Milliseconds between `start` (recorded earlier) and this event; both must be timing events.
  float elapsed_ms_since(const CudaEvent& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace megatron
