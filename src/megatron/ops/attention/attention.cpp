#include "megatron/ops/attention/attention.h"

#include <cmath>

#include "megatron/ops/attention/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/attention/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

struct AttentionDims {
  int64_t B, S, H, G, D;
};

// Validates q/k/v (and, when given, the tensors shaped like them) and returns the problem's extents.
AttentionDims check_qkv(OpCheck& check, const Tensor& q, const Tensor& k, const Tensor& v) {
  check.rank("q", q, 4).rank("k", k, 4);
  AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  check.shape("k", k, Shape{d.B, d.S, k.dim(2), d.D}).shape("v", v, k.shape());
  check.that(d.G > 0 && d.H % d.G == 0, "the query heads of q ", q.describe(), " must be a multiple of the key/value heads of k ",
             k.describe(), " (H % G == 0, G > 0)");
  check.dtype_in("q", q, {F64, F32, BF16, F16}).same_dtype({{"q", q}, {"k", k}, {"v", v}});
  return d;
}

void check_scale(OpCheck& check, const AttentionOptions& options) {
  check.that(std::isfinite(options.scale), "options.scale must be finite, got ", options.scale);
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
  AttentionDims d = check_qkv(check, q, k, v);
  check.shape("out", out, q.shape()).same_dtype({{"q", q}, {"out", out}});
  check.shape("stats", stats, Shape{d.B, d.H, d.S, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  if (q.numel() == 0) return;
  float scale = attention_scale(options, d.D);
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_forward(ctx, out, stats, q, k, v, options.causal, scale),
                    cpu::attention_forward(out, stats, q, k, v, options.causal, scale));
}

void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                        const AttentionOptions& options) {
  OpCheck check("attention_backward");
  check.device(ctx, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                     {"stats", stats}});
  AttentionDims d = check_qkv(check, q, k, v);
  check.shape("out", out, q.shape()).shape("dout", dout, q.shape()).shape("dq", dq, q.shape());
  check.shape("dk", dk, k.shape()).shape("dv", dv, k.shape());
  check.same_dtype({{"q", q}, {"out", out}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
  check.shape("stats", stats, Shape{d.B, d.H, d.S, 1}).dtype("stats", stats, F32);
  check_scale(check, options);
  if (q.numel() == 0) return;
  float scale = attention_scale(options, d.D);
  MEGATRON_DISPATCH(ctx,
                    cuda::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, options.causal, scale, options.deterministic),
                    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, stats, options.causal, scale));
}

}  // namespace megatron::ops
