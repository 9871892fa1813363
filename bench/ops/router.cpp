// Router benchmarks: Sinkhorn balancing (router_sinkhorn, Megatron's --moe-router-load-balancing-type sinkhorn)
// on logits uniform in [-1, 1), at the token counts of one router call (seq x micro-batch of a rank) and the
// expert counts of Mixtral (8), DeepSeek-style (64) and wider routers.
//
// The op iterates to convergence inside one cooperative launch, so a row's time is about (iterations) x (three
// grid-wide phases and their barriers). The config column names the iterations Megatron's loop needs on the
// same logits (counted here on the host in double; the device's fp32 count can differ by one), so rows of
// different shapes compare per iteration. Bytes: the logits read once and the balanced matrix written once (the fewest; each iteration
// re-reads the matrix from L2), so "% of copy" is low by design: the op is bound by its barriers, not by bandwidth.
// bench/reference/sinkhorn_peer.py times Megatron's own loop in PyTorch on the same shapes.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../bench_util.h"
#include "megatron/ops/router/sinkhorn.h"

namespace megatron::bench {
namespace {

// Iterations of Megatron's sinkhorn(exp(logits)) loop (stopping when the mean |change of d1| <= 1e-4), in double.
int sinkhorn_iterations(Context& ctx, const Tensor& device_logits) {
  CpuAllocator host_allocator;
  const Tensor host = to_device(ctx, device_logits, Device::cpu(), host_allocator);
  const int64_t T = host.shape()[0], E = host.shape()[1];
  const float* x = host.data<float>();
  std::vector<double> cost(static_cast<size_t>(T * E)), d0(static_cast<size_t>(T)), d1(static_cast<size_t>(E), 1.0);
  for (size_t i = 0; i < cost.size(); ++i) cost[i] = std::exp(double(x[i]));
  int iterations = 0;
  for (double error = 1e9; error > 1e-4 && iterations < ops::kSinkhornMaxIterations; ++iterations) {
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[size_t(e)] * cost[size_t(t * E + e)];
      d0[size_t(t)] = (1.0 / double(T)) / (s + 1e-8);
    }
    error = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += d0[size_t(t)] * cost[size_t(t * E + e)];
      const double next = (1.0 / double(E)) / (s + 1e-8);
      error += std::fabs(d1[size_t(e)] - next) / double(E);
      d1[size_t(e)] = next;
    }
  }
  return iterations;
}

}  // namespace

std::vector<OpBenchRow> bench_router(Context& ctx) {
  struct Shape2 {
    int64_t tokens, experts;
  };
  const Shape2 shapes[] = {{4096, 8}, {8192, 8}, {16384, 8}, {8192, 64}, {8192, 128}};
  std::vector<OpBenchRow> rows;
  for (const Shape2& s : shapes) {
    const Shape shape{s.tokens, s.experts};
    Tensor logits = random_device_tensor(ctx, shape, DType::F32, 31 + uint64_t(s.experts));
    Tensor balanced = ctx.empty(shape, DType::F32);
    const int iterations = sinkhorn_iterations(ctx, logits);
    const double ms = median_ms(ctx, [&] { ops::router_sinkhorn(ctx, balanced, logits); });
    rows.push_back({"router_sinkhorn f32",
                    str_cat("[", s.tokens, ", ", s.experts, "], ", iterations, " iterations, ",
                            int(1000.0 * ms / std::max(iterations, 1) + 0.5), " us each"),
                    ms, 0, 2.0 * double(logits.nbytes())});
  }
  return rows;
}

}  // namespace megatron::bench
