#include "megatron/ops/attention/attention.h"

#include <cmath>

#include "megatron/ops/attention/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/qkv/qkv.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/attention/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

struct AttentionDims {
  int64_t B, Sq, Skv, H, G, D;
};

// Validates q/k/v and the mask's needs and returns the problem's extents.
AttentionDims check_qkv(OpCheck& check, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionOptions& options) {
  check.rank("q", q, 4).rank("k", k, 4);
  AttentionDims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  check.that(k.dim(0) == d.B && k.dim(3) == d.D, "k ", k.describe(), " must be [B, Skv, G, D] with the batch and ",
             "head dimension of q ", q.describe(), " = [B, Sq, H, D]");
  check.shape("v", v, k.shape());
  check.that(d.G > 0 && d.H % d.G == 0, "the query heads of q ", q.describe(), " must be a multiple of the key/value heads of k ",
             k.describe(), " (H % G == 0, G > 0)");
  check.dtype_in("q", q, {F64, F32, BF16, F16}).same_dtype({{"q", q}, {"k", k}, {"v", v}});
  check.that(d.Sq == 0 || d.Skv > 0, "every query needs at least one key: q ", q.describe(), " has Sq = ", d.Sq,
             " but k ", k.describe(), " has Skv = 0");
  // Bottom-right alignment puts the queries at the last Sq positions of the keys' sequence: fewer keys than
  // queries would leave the first queries with nothing to see.
  check.that(!options.causal || d.Skv >= d.Sq, "causal attention needs Skv >= Sq (query i sees keys ",
             "j <= i + Skv - Sq): q ", q.describe(), " has Sq = ", d.Sq, " but k ", k.describe(), " has Skv = ", d.Skv);
  return d;
}

void check_scale(OpCheck& check, const AttentionOptions& options) {
  check.that(std::isfinite(options.scale), "options.scale must be finite, got ", options.scale);
}

void check_dropout(OpCheck& check, Context& ctx, const AttentionOptions& options, const AttentionDims& d) {
  if (!options.dropout.enabled()) return;
  const std::string violation = attention_dropout_violation(options.dropout, d.H, d.Sq, d.Skv);
  check.that(violation.empty(), "options.dropout: ", violation);
  if (!ctx.is_cuda() || d.Sq == 0) return;
  check.that(d.Skv > 1, "attention dropout (p = ", options.dropout.p, ") over a single key (Skv = 1) is not ",
             "supported on CUDA (that case runs kernels of ours without dropout)");
  check.that(!options.causal || d.Sq == d.Skv, "attention dropout (p = ", options.dropout.p, ") with a causal mask ",
             "over more keys than queries (Sq = ", d.Sq, " < Skv = ", d.Skv, ", context parallelism's all_gather ",
             "blocks) is not supported by cuDNN's fused attention: use --cp-comm-type p2p or a2a, or ",
             "--attention-dropout 0");
}

}  // namespace

float attention_scale(const AttentionOptions& options, int64_t head_dim) {
  if (options.scale != 0.0f) return options.scale;
  return head_dim > 0 ? float(1.0 / std::sqrt(double(head_dim))) : 1.0f;
}

void attention_forward(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& options) {
  OpCheck check("attention_forward");
  check.device(ctx, {{"out", out}, {"stats", stats}, {"q", q}, {"k", k}, {"v", v}});
  AttentionDims d = check_qkv(check, q, k, v, options);
  check.shape("out", out, q.shape()).same_dtype({{"q", q}, {"out", out}});
  check.shape("stats", stats, Shape{d.B, d.H, d.Sq, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  check_dropout(check, ctx, options, d);
  if (q.numel() == 0) return;
  float scale = attention_scale(options, d.D);
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_forward(ctx, out, stats, q, k, v, options.causal, scale, options.dropout),
                    cpu::attention_forward(out, stats, q, k, v, options.causal, scale, options.dropout));
}

void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                        const AttentionOptions& options) {
  OpCheck check("attention_backward");
  check.device(ctx, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                     {"stats", stats}});
  AttentionDims d = check_qkv(check, q, k, v, options);
  check.shape("out", out, q.shape()).shape("dout", dout, q.shape()).shape("dq", dq, q.shape());
  check.shape("dk", dk, k.shape()).shape("dv", dv, k.shape());
  check.same_dtype({{"q", q}, {"out", out}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
  check.shape("stats", stats, Shape{d.B, d.H, d.Sq, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  check_dropout(check, ctx, options, d);
  if (q.numel() == 0) {  // no query attends the keys (Sq == 0 or H == 0): their gradients are zero
    if (dk.numel() > 0) fill(ctx, dk, 0.0);
    if (dv.numel() > 0) fill(ctx, dv, 0.0);
    return;
  }
  float scale = attention_scale(options, d.D);
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, options.causal, scale, options.deterministic,
                                             options.dropout),
                    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, stats, options.causal, scale,
                                            options.dropout));
}

namespace {

// The packed layout's checks (self-attention: Sq == Skv == S, G == H).
AttentionDims check_packed(OpCheck& check, const Tensor& qkv, const Tensor& out) {
  check.rank("out", out, 4).rank("qkv", qkv, 3);
  AttentionDims d{out.dim(0), out.dim(1), out.dim(1), out.dim(2), out.dim(2), out.dim(3)};
  check.shape("qkv", qkv, Shape{d.B, d.Sq, d.H * 3 * d.D});
  check.dtype_in("qkv", qkv, {F64, F32, BF16, F16}).same_dtype({{"qkv", qkv}, {"out", out}});
  return d;
}

// Contiguous q, k, v [B, S, H, D] copied out of the packed layout (the CPU reference and cuDNN's S == 1 case).
struct SplitQkv {
  Tensor q, k, v;
};
SplitQkv split_packed(Context& ctx, const Tensor& qkv, const AttentionDims& d) {
  const Shape shape{d.B, d.Sq, d.H, d.D};
  SplitQkv s{ctx.empty(shape, qkv.dtype()), ctx.empty(shape, qkv.dtype()), ctx.empty(shape, qkv.dtype())};
  split_qkv_forward(ctx, s.q, s.k, s.v, qkv);
  return s;
}

}  // namespace

void attention_forward_packed(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& qkv,
                              const AttentionOptions& options) {
  OpCheck check("attention_forward_packed");
  check.device(ctx, {{"out", out}, {"stats", stats}, {"qkv", qkv}});
  AttentionDims d = check_packed(check, qkv, out);
  check.shape("stats", stats, Shape{d.B, d.H, d.Sq, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  check_dropout(check, ctx, options, d);
  if (out.numel() == 0) return;
  if (ctx.is_cuda() && d.Sq > 1) {
#if MEGATRON_WITH_CUDA
    cuda::attention_forward_packed(ctx, out, stats, qkv, options.causal, attention_scale(options, d.D), options.dropout);
#endif
    return;
  }
  SplitQkv s = split_packed(ctx, qkv, d);
  attention_forward(ctx, out, stats, s.q, s.k, s.v, options);
}

void attention_backward_packed(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& stats, const AttentionOptions& options) {
  OpCheck check("attention_backward_packed");
  check.device(ctx, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}, {"stats", stats}});
  AttentionDims d = check_packed(check, qkv, out);
  check.shape("dqkv", dqkv, qkv.shape()).shape("dout", dout, out.shape());
  check.same_dtype({{"qkv", qkv}, {"dqkv", dqkv}, {"dout", dout}});
  check.shape("stats", stats, Shape{d.B, d.H, d.Sq, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  check_dropout(check, ctx, options, d);
  if (out.numel() == 0) return;
  if (ctx.is_cuda() && d.Sq > 1) {
#if MEGATRON_WITH_CUDA
    cuda::attention_backward_packed(ctx, dqkv, dout, qkv, out, stats, options.causal, attention_scale(options, d.D),
                                    options.deterministic, options.dropout);
#endif
    return;
  }
  SplitQkv s = split_packed(ctx, qkv, d);
  SplitQkv g{ctx.empty(s.q.shape(), qkv.dtype()), ctx.empty(s.q.shape(), qkv.dtype()), ctx.empty(s.q.shape(), qkv.dtype())};
  attention_backward(ctx, g.q, g.k, g.v, dout, s.q, s.k, s.v, out, stats, options);
  merge_qkv_backward(ctx, dqkv, g.q, g.k, g.v);
}

}  // namespace megatron::ops
