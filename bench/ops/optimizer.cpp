// Optimizer benchmarks: ~1B parameters in 200 tensors (views into contiguous buffers, as Megatron's grad
// and param buffers), memory-bound. Bytes per element: AdamW reads master, exp_avg, exp_avg_sq (4 each) and
// the grad (2 or 4), writes master, exp_avg, exp_avg_sq (4 each) and the bf16 model param (2); the L2 norm
// reads each grad once; scale reads and writes each element once (in place).
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/core/cuda_check.h"
#include "megatron/ops/optimizer/optimizer.h"

namespace megatron::bench {
namespace {

// A random flat tensor of n elements built from a smaller random block repeated (host filling of billions
// of elements would dominate the run time); never zeros.
Tensor tiled_random(Context& ctx, int64_t n, DType dtype, uint64_t seed, double lo, double hi) {
  const int64_t block_n = std::min<int64_t>(n, int64_t(1) << 24);
  Tensor block = random_device_tensor(ctx, Shape{block_n}, dtype, seed, lo, hi);
  Tensor t = ctx.empty(Shape{n}, dtype);
  for (int64_t i = 0; i < n; i += block_n) {
    const int64_t len = std::min(block_n, n - i);
    CUDA_CHECK(cudaMemcpyAsync(t.slice(i, i + len).data_ptr(), block.data_ptr(), size_t(len) * dtype_size(dtype),
                               cudaMemcpyDeviceToDevice, ctx.stream()));
  }
  ctx.synchronize();
  return t;
}

// 200 tensor sizes summing to ~1.0e9: alternating large (matrix-like) and small (bias/norm-like) ones.
std::vector<int64_t> tensor_sizes() {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 200; ++i) sizes.push_back(i % 4 == 3 ? 4096 : int64_t(6702336) + (i % 7) * 4096);
  return sizes;
}

std::vector<Tensor> views(const Tensor& flat, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    out.push_back(flat.slice(at, at + n));
    at += n;
  }
  return out;
}

}  // namespace

std::vector<OpBenchRow> bench_optimizer(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const std::vector<int64_t> sizes = tensor_sizes();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const double n = double(total);
  const std::string config = std::to_string(total) + " params, " + std::to_string(sizes.size()) + " tensors";

  Tensor master = tiled_random(ctx, total, DType::F32, 1, -1, 1);
  Tensor exp_avg = tiled_random(ctx, total, DType::F32, 2, -1e-3, 1e-3);
  Tensor exp_avg_sq = tiled_random(ctx, total, DType::F32, 3, 0, 1e-6);
  Tensor grad_bf16 = tiled_random(ctx, total, DType::BF16, 4, -1e-2, 1e-2);
  Tensor model = ctx.empty(Shape{total}, DType::BF16);
  std::vector<Tensor> p = views(master, sizes), m = views(exp_avg, sizes), v = views(exp_avg_sq, sizes),
                      g16 = views(grad_bf16, sizes), out = views(model, sizes);

  ops::AdamWConfig cfg;
  cfg.lr = 1e-4f;
  cfg.weight_decay = 0.1f;
  cfg.beta2 = 0.95f;
  cfg.step = 100;
  std::vector<ops::AdamParamGroupTensors> groups;
  for (size_t i = 0; i < sizes.size(); ++i)
    groups.push_back({p[i], m[i], v[i], g16[i], out[i], i % 4 == 3 ? std::optional<float>(0.f) : std::nullopt});
  double ms = median_ms(ctx, [&] { ops::adamw_step(ctx, groups, cfg); }, 3, 10);
  rows.push_back({"adamw_step grad bf16, param bf16", config, ms, 0, n * (4 + 4 + 4 + 2 + 4 + 4 + 4 + 2)});

  Tensor out_norm = ctx.empty(Shape{1}, DType::F32), per = ctx.empty(Shape{int64_t(sizes.size())}, DType::F32);
  ms = median_ms(ctx, [&] { ops::multi_tensor_l2_norm(ctx, out_norm, per, g16); }, 3, 10);
  rows.push_back({"multi_tensor_l2_norm bf16", config, ms, 0, n * 2});
  Tensor found_inf = ctx.empty(Shape{1}, DType::F32);
  CUDA_CHECK(cudaMemsetAsync(found_inf.data_ptr(), 0, 4, ctx.stream()));
  ms = median_ms(ctx, [&] { ops::multi_tensor_scale(ctx, g16, found_inf, g16, 1.0f); }, 3, 10);
  rows.push_back({"multi_tensor_scale bf16 in-place", config, ms, 0, n * 4});
  grad_bf16 = Tensor();
  g16.clear();
  for (auto& gr : groups) gr.grad = Tensor();

  Tensor grad_f32 = tiled_random(ctx, total, DType::F32, 5, -1e-2, 1e-2);
  std::vector<Tensor> g32 = views(grad_f32, sizes);
  for (size_t i = 0; i < sizes.size(); ++i) groups[i].grad = g32[i];
  ms = median_ms(ctx, [&] { ops::adamw_step(ctx, groups, cfg); }, 3, 10);
  rows.push_back({"adamw_step grad f32, param bf16", config, ms, 0, n * (4 + 4 + 4 + 4 + 4 + 4 + 4 + 2)});
  ms = median_ms(ctx, [&] { ops::multi_tensor_l2_norm(ctx, out_norm, per, g32); }, 3, 10);
  rows.push_back({"multi_tensor_l2_norm f32", config, ms, 0, n * 4});
  ms = median_ms(ctx, [&] { ops::multi_tensor_scale(ctx, g32, found_inf, g32, 1.0f); }, 3, 10);
  rows.push_back({"multi_tensor_scale f32 in-place", config, ms, 0, n * 8});
  return rows;
}

}  // namespace megatron::bench
