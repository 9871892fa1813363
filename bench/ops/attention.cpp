// Attention benchmark: cuDNN fused flash attention, causal bf16, D=128, S=4096, B=4, H=32 with G=8 (GQA)
// and G=32 (MHA). Flop count as FlashAttention reports it: 4*S^2*D per head forward, halved for causal;
// backward 2.5x forward. Then packed documents (THD, cuDNN's ragged offsets) of 256 to 4096 tokens filling the
// same 16384 tokens as the GQA rows, their FLOPs counted over the (query, key) pairs actually computed: the
// rows to compare with the GQA causal ones. Last, attention dropout 0.1 at the 0.89B model's shape (B=4, S=2048,
// H=16, D=128) with each mask generator (ops/attention/attention_dropout.h) beside the same call without dropout;
// the by-index rows include writing the mask.
#include <string>
#include <vector>

#include "../bench_util.h"
#include "megatron/ops/attention/attention.h"
#include "megatron/ops/attention/attention_varlen.h"

namespace megatron::bench {

namespace {

void dropout_rows(Context& ctx, std::vector<OpBenchRow>& rows) {
  const int64_t B = 4, S = 2048, H = 16, D = 128;
  const DType dt = DType::BF16;
  Tensor q = random_device_tensor(ctx, {B, S, H, D}, dt, 5), k = random_device_tensor(ctx, {B, S, H, D}, dt, 6);
  Tensor v = random_device_tensor(ctx, {B, S, H, D}, dt, 7), dout = random_device_tensor(ctx, {B, S, H, D}, dt, 8);
  Tensor out = ctx.empty({B, S, H, D}, dt), stats = ctx.empty({B, H, S, 1}, DType::F32);
  Tensor dq = ctx.empty({B, S, H, D}, dt), dk = ctx.empty({B, S, H, D}, dt), dv = ctx.empty({B, S, H, D}, dt);
  const double fwd_flop = 2.0 * double(B * H) * double(S) * double(S) * double(D);
  const std::string config = str_cat("B=", B, " S=", S, " H=", H, " D=", D, " p=0.1");
  struct Mode {
    const char* name;
    float p;
    ops::DropoutMasks masks;
  };
  for (const Mode& m : {Mode{"no dropout", 0.0f, ops::DropoutMasks::Device},
                        Mode{"dropout cuDNN Philox", 0.1f, ops::DropoutMasks::Device},
                        Mode{"dropout by index", 0.1f, ops::DropoutMasks::ByIndex}}) {
    ops::AttentionOptions options;
    options.dropout = {.p = m.p, .masks = m.masks, .seed = 1234, .offset = 1};
    const double fwd_ms = median_ms(ctx, [&] { ops::attention_forward(ctx, out, stats, q, k, v, options); });
    rows.push_back({str_cat("attention fwd causal bf16, ", m.name), config, fwd_ms, fwd_flop, 0});
    const double bwd_ms =
        median_ms(ctx, [&] { ops::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, options); });
    rows.push_back({str_cat("attention bwd causal bf16, ", m.name), config, bwd_ms, 2.5 * fwd_flop, 0});
  }
}

}  // namespace

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
  {
    const int64_t G = 8;
    const std::vector<int64_t> lengths = {4096, 256, 2048, 512, 3072, 1024, 768, 2816, 1792};  // 16384 tokens
    std::vector<int64_t> offsets = {0};
    for (int64_t l : lengths) offsets.push_back(offsets.back() + l);
    const int64_t T = offsets.back();
    const Tensor cu = Tensor::from_blob(offsets.data(), {int64_t(offsets.size())}, DType::I64, Device::cpu());
    Tensor q = random_device_tensor(ctx, {T, H, D}, dt, 5);
    Tensor k = random_device_tensor(ctx, {T, G, D}, dt, 6);
    Tensor v = random_device_tensor(ctx, {T, G, D}, dt, 7);
    Tensor dout = random_device_tensor(ctx, {T, H, D}, dt, 8);
    Tensor out = ctx.empty({T, H, D}, dt), stats = ctx.empty({H, T}, DType::F32);
    Tensor dq = ctx.empty({T, H, D}, dt), dk = ctx.empty({T, G, D}, dt), dv = ctx.empty({T, G, D}, dt);
    ops::AttentionOptions options;
    const double fwd_flop = 4.0 * double(H) * double(D) * ops::attention_varlen_pairs(cu, cu, true);
    const std::string config = str_cat("T=", T, " in 9 documents of 256-4096, H=", H, " G=", G, " D=", D);
    const double fwd_ms =
        median_ms(ctx, [&] { ops::attention_forward_varlen(ctx, out, stats, q, k, v, cu, cu, options); });
    rows.push_back({"attention fwd packed causal bf16", config, fwd_ms, fwd_flop, 0});
    const double bwd_ms = median_ms(ctx, [&] {
      ops::attention_backward_varlen(ctx, dq, dk, dv, dout, q, k, v, out, stats, cu, cu, options);
    });
    rows.push_back({"attention bwd packed causal bf16", config, bwd_ms, 2.5 * fwd_flop, 0});
  }
  dropout_rows(ctx, rows);
  return rows;
}

}  // namespace megatron::bench
