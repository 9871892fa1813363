#include "bench_util.h"

#include <algorithm>

#include "megatron/core/cuda_check.h"
#include "megatron/core/philox.h"
#include "megatron/runtime/cuda_stream.h"

namespace megatron::bench {

double median_ms(Context& ctx, const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  ctx.synchronize();
  std::vector<double> times;
  CudaEvent start(true), stop(true);
  for (int i = 0; i < iters; ++i) {
    start.record(ctx.stream());
    fn();
    stop.record(ctx.stream());
    stop.synchronize();
    times.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Tensor random_device_tensor(Context& ctx, const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  // Filled on the host (once per benchmark; never zeros) and copied over.
  CpuAllocator host;
  Tensor h = Tensor::empty(shape, dtype, host);
  visit_dtype(dtype, [&]<class T>() {
    T* p = static_cast<T*>(h.data_ptr());
    for (int64_t i = 0; i < h.numel(); ++i) {
      double v = lo + (hi - lo) * philox_uniform(seed, 0, uint64_t(i));
      if constexpr (std::is_integral_v<T>) p[i] = T(v);
      else p[i] = from_double<T>(v);
    }
  });
  Tensor d = ctx.empty(shape, dtype);
  copy_tensor(ctx, d, h);
  ctx.synchronize();
  return d;
}

}  // namespace megatron::bench
