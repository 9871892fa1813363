// gemm benchmark rows. The acceptance bar: bf16 8192^3 at >= 700 TFLOP/s on an H100 (cuBLASLt alone reaches
// ~790): the wrapper must add nothing but a plan-cache lookup. Inputs are random (never constant), outputs
// preallocated; every row is compute-bound, so `flop` = 2 * batch * M * N * K.
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_gemm(Context& ctx) {
  using ops::GemmEpilogue;
  using ops::GemmOptions;
  std::vector<OpBenchRow> rows;
  uint64_t seed = 1000;

  // D[M, N] = op(A) op(B) with A [M, K] and B [K, N] (or [N, K] when transpose_b).
  auto run = [&](const std::string& op, DType in, DType out, int64_t m, int64_t n, int64_t k, GemmOptions opt) {
    Tensor a = random_device_tensor(ctx, opt.transpose_a ? Shape{k, m} : Shape{m, k}, in, seed++);
    Tensor b = random_device_tensor(ctx, opt.transpose_b ? Shape{n, k} : Shape{k, n}, in, seed++);
    Tensor d = random_device_tensor(ctx, Shape{m, n}, out, seed++);  // also C when beta != 0
    if (opt.epilogue == GemmEpilogue::Bias || opt.epilogue == GemmEpilogue::BiasGelu)
      opt.bias = random_device_tensor(ctx, Shape{n}, is_fp8(in) ? DType::BF16 : out, seed++);
    if (opt.epilogue == GemmEpilogue::Gelu || opt.epilogue == GemmEpilogue::BiasGelu)
      opt.gelu_input_out = ctx.empty(Shape{m, n}, out);
    if (is_fp8(in)) {
      opt.a_scale = random_device_tensor(ctx, ops::fp8_scale_shape(opt.a_scale_layout, m, k), DType::F32, seed++, 0.5, 1.0);
      opt.b_scale = random_device_tensor(ctx, ops::fp8_scale_shape(opt.b_scale_layout, n, k), DType::F32, seed++, 0.5, 1.0);
    }
    double ms = median_ms(ctx, [&] { ops::gemm(ctx, d, a, b, opt); });
    rows.push_back(OpBenchRow{.op = op,
                              .config = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k),
                              .ms = ms,
                              .flop = 2.0 * double(m) * double(n) * double(k)});
  };

  run("gemm bf16 NN", DType::BF16, DType::BF16, 8192, 8192, 8192, {});
  run("gemm bf16 NT (x W^T)", DType::BF16, DType::BF16, 8192, 8192, 8192, {.transpose_b = true});
  run("gemm bf16 NT +bias+gelu (aux out)", DType::BF16, DType::BF16, 8192, 8192, 8192,
      {.transpose_b = true, .epilogue = GemmEpilogue::BiasGelu});
  // GPT-shaped MLP fc1: tokens 16384, hidden 2048, ffn 5632; and its weight gradient into an fp32 main grad.
  run("gemm bf16 NT fc1 (GPT)", DType::BF16, DType::BF16, 16384, 5632, 2048, {.transpose_b = true});
  run("gemm bf16->f32 TN dW += dY^T X (GPT)", DType::BF16, DType::F32, 5632, 2048, 16384,
      {.transpose_a = true, .beta = 1.0f});
  run("gemm fp8 e4m3 NT -> bf16", DType::F8E4M3, DType::BF16, 8192, 8192, 8192, {.transpose_b = true});
  run("gemm fp8 e4m3 NT -> bf16 (fast accum)", DType::F8E4M3, DType::BF16, 8192, 8192, 8192,
      {.transpose_b = true, .fp8_fast_accum = true});
  // FP8 block scaling (the blockwise recipe's three GEMMs): x (1x128) W^T (128x128), and the weight gradient
  // dY^T (1x128) X (1x128) into an fp32 main grad, at the Llama 0.89B's fc1 shape.
  using ops::Fp8ScaleLayout;
  run("gemm fp8 e4m3 NT 1x128 x 128x128 -> bf16", DType::F8E4M3, DType::BF16, 8192, 8192, 8192,
      {.transpose_b = true, .a_scale_layout = Fp8ScaleLayout::Rows1x128, .b_scale_layout = Fp8ScaleLayout::Blocks128x128});
  run("gemm fp8 e4m3 NT fc1 1x128 x 128x128 -> bf16", DType::F8E4M3, DType::BF16, 16384, 11264, 2048,
      {.transpose_b = true, .a_scale_layout = Fp8ScaleLayout::Rows1x128, .b_scale_layout = Fp8ScaleLayout::Blocks128x128});
  run("gemm fp8 e4m3 NT fc1 tensor scales -> bf16", DType::F8E4M3, DType::BF16, 16384, 11264, 2048,
      {.transpose_b = true});
  run("gemm fp8 e4m3 NT fc1 dW 1x128 x 1x128 -> f32 += ", DType::F8E4M3, DType::F32, 11264, 2048, 16384,
      {.transpose_b = true, .beta = 1.0f, .a_scale_layout = Fp8ScaleLayout::Rows1x128,
       .b_scale_layout = Fp8ScaleLayout::Rows1x128});
  run("gemm fp8 e4m3 NT fc1 dW tensor scales -> f32 += ", DType::F8E4M3, DType::F32, 11264, 2048, 16384,
      {.transpose_b = true, .beta = 1.0f});
  run("gemm f32 NN (no tf32)", DType::F32, DType::F32, 4096, 4096, 4096, {});
  return rows;
}

}  // namespace megatron::bench
