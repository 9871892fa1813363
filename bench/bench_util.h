// Shared pieces of the op benchmarks: a timer on the context's stream and one row format.
//
// Timing follows the device METHOD: warm up first, time each repetition with CUDA events, report the
// median; inputs are random (never zeros); sizes fill the GPU.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "megatron/runtime/context.h"

namespace megatron::bench {

struct OpBenchRow {
  std::string op;       // "gemm bf16 NN"
  std::string config;   // "8192x8192x8192"
  double ms = 0;        // median time of one call
  double flop = 0;      // useful floating-point operations of one call (0 for memory-bound ops)
  double bytes = 0;     // fewest bytes one call must move (each input read once, each output written once)
};

// Median milliseconds of fn() on ctx's stream over `iters` timed calls after `warmup` untimed ones.
double median_ms(Context& ctx, const std::function<void()>& fn, int warmup = 5, int iters = 30);

// Random tensor on ctx's device, uniform in [lo, hi).
Tensor random_device_tensor(Context& ctx, const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1);

}  // namespace megatron::bench
