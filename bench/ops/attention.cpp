// Attention benchmark: cuDNN fused flash attention, causal bf16, D=128, S=4096, B=4, H=32 with G=8 (GQA)
// and G=32 (MHA). Flop count as FlashAttention reports it: 4*S^2*D per head forward, halved for causal;
// backward 2.5x forward.
#include <string>
#include <vector>

#include "../bench_util.h"
#include "megatron/ops/attention/attention.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_attention(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const int64_t B = 4, S = 4096, H = 32, D = 128;
  const DType dt = DType::BF16;
  for (int64_t G : {int64_t(8), int64_t(32)}) {
    Tensor q = random_device_tensor(ctx, {B, S, H, D}, dt, 1);
    Tensor k = random_device_tensor(ctx, {B, S, G, D}, dt, 2);
    Tensor v = random_device_tensor(ctx, {B, S, G, D}, dt, 3);
    Tensor dout = random_device_tensor(ctx, {B, S, H, D}, dt, 4);
    Tensor out = ctx.empty({B, S, H, D}, dt), stats = ctx.empty({B, H, S, 1}, DType::F32);
    Tensor dq = ctx.empty({B, S, H, D}, dt), dk = ctx.empty({B, S, G, D}, dt), dv = ctx.empty({B, S, G, D}, dt);
    ops::AttentionOptions options;  // causal, 1/sqrt(D)
    const double fwd_flop = 2.0 * double(B * H) * double(S) * double(S) * double(D);
    const std::string config = str_cat("B=", B, " S=", S, " H=", H, " G=", G, " D=", D);
    const double fwd_ms = median_ms(ctx, [&] { ops::attention_forward(ctx, out, stats, q, k, v, options); });
    rows.push_back({"attention fwd causal bf16", config, fwd_ms, fwd_flop, 0});
    const double bwd_ms =
        median_ms(ctx, [&] { ops::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, options); });
    rows.push_back({"attention bwd causal bf16", config, bwd_ms, 2.5 * fwd_flop, 0});
  }
  return rows;
}

}  // namespace megatron::bench
