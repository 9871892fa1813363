// Cross-entropy benchmarks at training sizes (16384 tokens; GPT-2 padded and Llama 3 vocabularies, bf16):
// memory-bound. Bytes: the forward reads the logits once; the in-place backward reads and writes them once
// (the per-token vectors are negligible but counted).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/core/cuda_check.h"
#include "megatron/ops/cross_entropy/cross_entropy.h"

namespace megatron::bench {
namespace {

// A random [rows, cols] tensor built from a smaller random block repeated (filling billions of elements on the
// host would dominate the benchmark's run time); values are never zeros.
Tensor tiled_random(Context& ctx, int64_t rows, int64_t cols, DType dtype, uint64_t seed, double lo, double hi) {
  const int64_t block_rows = std::min<int64_t>(rows, 512);
  Tensor block = random_device_tensor(ctx, Shape{block_rows, cols}, dtype, seed, lo, hi);
  Tensor t = ctx.empty(Shape{rows, cols}, dtype);
  for (int64_t r = 0; r < rows; r += block_rows) {
    const int64_t n = std::min(block_rows, rows - r);
    CUDA_CHECK(cudaMemcpyAsync(t.slice(r, r + n).data_ptr(), block.data_ptr(), size_t(n * cols) * dtype_size(dtype),
                               cudaMemcpyDeviceToDevice, ctx.stream()));
  }
  ctx.synchronize();
  return t;
}

}  // namespace

std::vector<OpBenchRow> bench_cross_entropy(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const int64_t tokens = 16384;
  for (int64_t vocab : {int64_t(50304), int64_t(128256)}) {
    const DType dt = DType::BF16;
    const std::string config = std::to_string(tokens) + "x" + std::to_string(vocab) + " " + dtype_name(dt);
    Tensor logits = tiled_random(ctx, tokens, vocab, dt, 1, -8, 8);
    Tensor targets = random_device_tensor(ctx, Shape{tokens}, DType::I64, 2, 0, double(vocab));
    Tensor mask = random_device_tensor(ctx, Shape{tokens}, DType::F32, 3, 0.5, 1);
    Tensor losses = ctx.empty(Shape{tokens}, DType::F32), lse = ctx.empty(Shape{tokens}, DType::F32);
    Tensor dlosses = ctx.empty(Shape{tokens}, DType::F32);
    ops::masked_mean_loss_grad(ctx, dlosses, mask, double(tokens));
    const double logit_bytes = double(tokens) * double(vocab) * double(dtype_size(dt));
    const double per_token = double(tokens) * 4;  // bytes of one F32 per token (targets are I64: two)

    double ms = median_ms(ctx, [&] { ops::cross_entropy_forward(ctx, losses, lse, logits, targets); });
    rows.push_back({"cross_entropy fwd", config, ms, 0, logit_bytes + 4 * per_token});
    // The backward overwrites the logits with gradients; the forward timed above ran on the original values.
    ms = median_ms(ctx, [&] { ops::cross_entropy_backward(ctx, logits, dlosses, logits, targets, lse); });
    rows.push_back({"cross_entropy bwd in-place", config, ms, 0, 2 * logit_bytes + 4 * per_token});
    ms = median_ms(ctx, [&] {
      ops::cross_entropy_forward(ctx, losses, lse, logits, targets);
      ops::cross_entropy_backward(ctx, logits, dlosses, logits, targets, lse);
    });
    rows.push_back({"cross_entropy fwd+bwd in-place", config, ms, 0, 3 * logit_bytes + 8 * per_token});
  }
  return rows;
}

}  // namespace megatron::bench
