// Context: everything an op needs to run on one device, passed explicitly (no globals): the device, the
// allocator for outputs and scratch, and on CUDA the stream all work is queued on plus the library
// handles (cuBLASLt, cuDNN) and plan caches. Ops take `Context&` first, then destination, then inputs.
//
// Ordering contract: CUDA work is asynchronous on ctx.stream(); host code reading device results calls
// ctx.synchronize() (copy_tensor to a CPU tensor does so itself).
#pragma once

#include <memory>
#include <source_location>

#include "megatron/tensor/tensor.h"

namespace megatron {

struct CudaLibraries;  // runtime/cuda_libraries.h (CUDA builds)
class Timeline;       // runtime/timeline.h

// Whether this binary was built with the CUDA backend.
bool cuda_backend_compiled();
// Number of visible CUDA devices (0 in a CPU-only build or on a machine without a GPU).
int cuda_device_count();
// Marks the region an external profiler (ncu / nsys with --profile-from-start off) records:
// cudaProfilerStart / cudaProfilerStop. No-ops in a CPU-only build.
void cuda_profiler_start();
void cuda_profiler_stop();

class Context {
 public:
  static std::unique_ptr<Context> cpu();
  // Throws when the build has no CUDA backend or the device does not exist.
  static std::unique_ptr<Context> cuda(int device_index = 0);
  static std::unique_ptr<Context> create(Device device);
  ~Context();

  Device device() const { return device_; }
  // Deterministic mode (--deterministic-mode): ops pick their algorithms without timing them (cuBLASLt's
  // first heuristic choice instead of the fastest of several, measured), so two runs, or a run and its
  // resume, execute the same kernels and give the same bits. Ops with nondeterministic kernels (attention's
  // backward) take their own option. Off by default.
  bool deterministic() const { return deterministic_; }
  void set_deterministic(bool on) { deterministic_ = on; }
  bool is_cuda() const { return device_.is_cuda(); }
  Allocator& allocator() { return *allocator_; }
  StreamHandle stream() const { return stream_; }
  // Uninitialised tensor on this context's device, usable on its stream.
  Tensor empty(const Shape& shape, DType dtype, std::source_location caller = std::source_location::current());
  void synchronize();

  // Library handles and caches; throws on a CPU context.
  CudaLibraries& cuda_libraries();
  // Page-locked host memory for fast transfers; throws on a CPU context.
  Allocator& pinned_allocator();

  // The rank's profiler timeline while --profile records one (runtime/timeline.h), else null: work deep inside
  // the step (the tensor-parallel collectives and their GEMM chunks) adds its spans here. Not owned.
  Timeline* timeline() const { return timeline_; }
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 private:
  Context() = default;
  Device device_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Allocator> pinned_;
  std::unique_ptr<CudaLibraries> cuda_;
  StreamHandle stream_ = nullptr;
  bool deterministic_ = false;
  Timeline* timeline_ = nullptr;
};

// Copies the bytes of `src` into `dst` (any devices; same dtype and number of elements). Queued on
// ctx's stream; returns after the copy when `dst` is on the CPU.
void copy_tensor(Context& ctx, const Tensor& dst, const Tensor& src);
// The value of a one-element F32 or F64 tensor on any device, as a double (waits for it: a synchronisation
// point on CUDA).
double read_scalar(Context& ctx, const Tensor& t);
// New tensor on `device` holding a copy of `src`; a CPU destination comes from `host_allocator`, a CUDA
// one from ctx (which must then be that device's context).
Tensor to_device(Context& ctx, const Tensor& src, Device device, Allocator& host_allocator);

}  // namespace megatron
