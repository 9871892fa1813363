// fp8 family benchmarks. fp8_cast_transpose is memory-bound: each row reports the fewest bytes one call
// moves (the input read once, every fp8 output written once; the scalars are negligible), which the driver
// turns into GB/s against the copy ceiling. Shapes: a [tokens, hidden] activation and a [hidden, ffn]
// weight of a Llama-3-8B-sized layer, and its MLP's SwiGLU for the fused casts.
#include <string>
#include <utility>

#include "bench_util.h"
#include "megatron/ops/activation/activation.h"
#include "megatron/ops/fp8/fp8.h"
#include "megatron/ops/fp8_block/fp8_block.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_fp8(Context& ctx) {
  using enum DType;
  std::vector<OpBenchRow> rows;
  auto row = [&](const std::string& op, const std::string& config, double bytes, const std::function<void()>& fn) {
    rows.push_back(OpBenchRow{op, config, median_ms(ctx, fn), 0.0, bytes});
  };
  Tensor scale = random_device_tensor(ctx, Shape{1}, F32, 1, 100, 200);
  Tensor amax = random_device_tensor(ctx, Shape{1}, F32, 2, 0, 1);
  for (auto [R, C] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 14336}}) {
    const double n = double(R) * double(C);
    const std::string rc = std::to_string(R) + "x" + std::to_string(C);
    Tensor x = random_device_tensor(ctx, Shape{R, C}, BF16, 3);
    Tensor out = ctx.empty(Shape{R, C}, F8E4M3), out_t = ctx.empty(Shape{C, R}, F8E4M3);
    row("fp8_cast_transpose bf16->e4m3 out+out_t+amax", rc, n * (2 + 1 + 1),
        [&] { ops::fp8_cast_transpose(ctx, out, out_t, amax, x, scale); });
    row("fp8_cast_transpose bf16->e4m3 out_t+amax", rc, n * (2 + 1),
        [&] { ops::fp8_cast_transpose(ctx, Tensor(), out_t, amax, x, scale); });
    row("fp8_cast_transpose bf16->e4m3 out+amax", rc, n * (2 + 1),
        [&] { ops::fp8_cast_transpose(ctx, out, Tensor(), amax, x, scale); });
  }
  {
    const int64_t R = 8192, C = 4096;
    Tensor x = random_device_tensor(ctx, Shape{R, C}, F32, 4);
    Tensor out = ctx.empty(Shape{R, C}, F8E5M2), out_t = ctx.empty(Shape{C, R}, F8E5M2);
    row("fp8_cast_transpose f32->e5m2 out+out_t+amax", "8192x4096", double(R) * double(C) * (4 + 1 + 1),
        [&] { ops::fp8_cast_transpose(ctx, out, out_t, amax, x, scale); });
  }
  // SwiGLU into fc2's FP8 input and its backward into fc1's FP8 output gradient (the 8B's MLP at 4096 tokens,
  // F = 14336), each fused against the activation op and the cast run apart. Bytes: the fused op's fewest
  // (x and dy read once, q and q_t written), so the two-op rows' GB/s show the traffic the fusion removes.
  {
    const int64_t R = 4096, F = 14336;
    const double n = double(R) * double(F);
    const std::string rf = std::to_string(R) + "x" + std::to_string(F);
    Tensor x = random_device_tensor(ctx, Shape{R, 2 * F}, BF16, 8, -4, 4), dy = random_device_tensor(ctx, Shape{R, F}, BF16, 9);
    Tensor act = ctx.empty(Shape{R, F}, BF16), dx = ctx.empty(Shape{R, 2 * F}, BF16);
    Tensor q = ctx.empty(Shape{R, F}, F8E4M3), q_t = ctx.empty(Shape{F, R}, F8E4M3);
    Tensor g = ctx.empty(Shape{R, 2 * F}, F8E5M2), g_t = ctx.empty(Shape{2 * F, R}, F8E5M2);
    row("swiglu + fp8_cast_transpose bf16->e4m3 (two ops)", rf, n * (4 + 1 + 1), [&] {
      ops::swiglu_forward(ctx, act, x);
      ops::fp8_cast_transpose(ctx, q, q_t, amax, act, scale);
    });
    row("fp8_swiglu_cast_transpose bf16->e4m3 (fused)", rf, n * (4 + 1 + 1),
        [&] { ops::fp8_swiglu_cast_transpose(ctx, q, q_t, amax, x, scale); });
    row("swiglu_backward + fp8_cast_transpose bf16->e5m2 (two ops)", rf, n * (6 + 2 + 2), [&] {
      ops::swiglu_backward(ctx, dx, dy, x);
      ops::fp8_cast_transpose(ctx, g, g_t, amax, dx, scale);
    });
    row("fp8_swiglu_grad_cast_transpose bf16->e5m2 (fused)", rf, n * (6 + 2 + 2),
        [&] { ops::fp8_swiglu_grad_cast_transpose(ctx, g, g_t, amax, dy, x, scale); });
  }
  // The blockwise recipe's casts: an activation in 1x128 blocks both ways (q and the separately quantised
  // q_t), a weight in 128x128 blocks (q and its transpose).
  for (auto [R, C] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 14336}}) {
    const double n = double(R) * double(C);
    const std::string rc = std::to_string(R) + "x" + std::to_string(C);
    Tensor x = random_device_tensor(ctx, Shape{R, C}, BF16, 7);
    Tensor q = ctx.empty(Shape{R, C}, F8E4M3), q_t = ctx.empty(Shape{C, R}, F8E4M3);
    for (ops::Fp8ScaleLayout layout : {ops::Fp8ScaleLayout::Rows1x128, ops::Fp8ScaleLayout::Blocks128x128}) {
      Tensor s = ctx.empty(ops::fp8_scale_shape(layout, R, C), F32), s_t = ctx.empty(ops::fp8_scale_shape(layout, C, R), F32);
      row(std::string("fp8_block_quantize bf16->e4m3 q+q_t ") + ops::fp8_scale_layout_name(layout), rc, n * (2 + 1 + 1),
          [&] { ops::fp8_block_quantize(ctx, q, s, q_t, s_t, x, layout); });
    }
  }
  {  // Transformer Engine's default amax history length over a few hundred scaled tensors.
    const int64_t L = 1024, n = 384;
    Tensor history = random_device_tensor(ctx, Shape{L, n}, F32, 5, 0, 10);
    Tensor s = random_device_tensor(ctx, Shape{n}, F32, 6, 1, 2), s_inv = ctx.empty(Shape{n}, F32);
    row("fp8_delayed_scaling_update max", "L=1024 n=384", double(L) * double(n) * 4 * 2,
        [&] { ops::fp8_delayed_scaling_update(ctx, history, s, s_inv, 448.0f, 0, true); });
  }
  return rows;
}

}  // namespace megatron::bench
