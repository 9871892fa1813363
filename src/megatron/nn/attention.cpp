#include "megatron/nn/attention.h"

#include <utility>

#include "megatron/ops/attention/attention.h"
#include "megatron/ops/attention/attention_varlen.h"
#include "megatron/ops/attention/cached_attention.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/qkv/qkv.h"
#include "megatron/ops/rope/rope.h"
#include "megatron/parallel/cp_packed_attention.h"

namespace megatron::nn {

namespace {

// Tokens with positions of their own ([b, s]: --reset-position-ids) rotate as one row of b * s tokens, so
// that RoPE's per-token positions ([S]) fit: x [b, s, ...] seen as [1, b * s, ...].
Tensor one_row(const Tensor& x, bool per_token) {
  if (!per_token) return x;
  std::vector<int64_t> dims = x.shape().dims();
  dims[1] *= dims[0];
  dims[0] = 1;
  return x.view(dims);
}

// A [b, s, heads, d] tensor as the packed attention's [b * s, heads, d] token rows.
Tensor token_rows(const Tensor& x) { return x.view({x.dim(0) * x.dim(1), x.dim(2), x.dim(3)}); }

}  // namespace

SelfAttention::SelfAttention(Context& ctx, const std::string& name, const TransformerConfig& config,
                             const parallel::TensorParallel& tp, const parallel::ContextParallel& cp, int layer)
    : tp_(tp),
      cp_(cp),
      cp_type_(cp.comm_type(layer)),
      n_(config.heads() / tp.size()),
      g_(config.query_groups() / tp.size()),
      d_(config.head_dim()),
      rope_(config.position_embedding == PositionEmbedding::Rope),
      deterministic_(config.deterministic),
      rotary_percent_(config.rotary_percent),
      rotary_base_(config.rotary_base),
      dropout_p_(float(config.attention_dropout)),
      dropout_by_index_(config.attention_dropout_by_index),
      seed_(config.seed) {
  MEGATRON_CHECK(config.heads() % tp.size() == 0 && config.query_groups() % tp.size() == 0, "SelfAttention ", name,
                 ": ", config.heads(), " heads and ", config.query_groups(), " query groups must be divisible by TP ",
                 tp.size());
  const int64_t P = tp.size(), qkv_rows = P * g_ * (n_ / g_ + 2) * d_;
  linear_qkv = ColumnParallelLinear(ctx, name + ".linear_qkv", config.hidden(), qkv_rows, config.qkv_bias(),
                                    config.params_dtype, tp);
  linear_proj = RowParallelLinear(ctx, name + ".linear_proj", P * n_ * d_, config.hidden(), config.bias(),
                                  config.params_dtype, tp);
  if (config.qk_layernorm) {
    q_layernorm = Norm(ctx, name + ".q_layernorm", config, tp, {.per_head = true, .width = d_});
    k_layernorm = Norm(ctx, name + ".k_layernorm", config, tp, {.per_head = true, .width = d_});
  }
}

void SelfAttention::init(Context& ctx, const TransformerConfig& config) {
  linear_qkv.init(ctx, config.seed, config.init_method_std);
  linear_proj.init(ctx, config.seed, config.output_layer_init_std());
  if (q_layernorm.defined()) {
    q_layernorm.init(ctx);
    k_layernorm.init(ctx);
  }
}

void SelfAttention::split_heads(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                                const std::optional<ops::RopeOptions>& rope, NormSaved* q_norm,
                                NormSaved* k_norm) const {
  if (!q_layernorm.defined()) {
    ops::split_qkv_forward(ctx, q, k, v, qkv, rope);
    return;
  }
  Tensor q_raw = ctx.empty(q.shape(), q.dtype()), k_raw = ctx.empty(k.shape(), k.dtype());
  ops::split_qkv_forward(ctx, q_raw, k_raw, v, qkv, std::nullopt);
  NormSaved qs = q_layernorm.forward(ctx, q, q_raw), ks = k_layernorm.forward(ctx, k, k_raw);
  if (rope) {
    ops::rope_forward(ctx, q, q, *rope);
    ops::rope_forward(ctx, k, k, *rope);
  }
  if (q_norm != nullptr) *q_norm = std::move(qs);
  if (k_norm != nullptr) *k_norm = std::move(ks);
}

void SelfAttention::merge_heads_backward(Context& ctx, const Tensor& dqkv, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dv, const std::optional<ops::RopeOptions>& rope,
                                         NormSaved&& q_norm, NormSaved&& k_norm) {
  if (!q_layernorm.defined()) {
    ops::merge_qkv_backward(ctx, dqkv, dq, dk, dv, rope);
    return;
  }
  if (rope) {
    ops::rope_backward(ctx, dq, dq, *rope);
    ops::rope_backward(ctx, dk, dk, *rope);
  }
  Tensor dq_raw = ctx.empty(dq.shape(), dq.dtype()), dk_raw = ctx.empty(dk.shape(), dk.dtype());
  q_layernorm.backward(ctx, std::move(q_norm), dq_raw, dq);
  k_layernorm.backward(ctx, std::move(k_norm), dk_raw, dk);
  ops::merge_qkv_backward(ctx, dqkv, dq_raw, dk_raw, dv, std::nullopt);
}

std::optional<ops::RopeOptions> SelfAttention::rope(int64_t position_offset, const Tensor& positions) const {
  if (!rope_) return std::nullopt;
  return ops::RopeOptions{.base = rotary_base_,
                          .rotary_percent = rotary_percent_,
                          .position_offset = position_offset,
                          .positions = positions};
}

ops::AttentionOptions SelfAttention::core_options(std::optional<uint64_t> dropout_offset, int64_t s) const {
  ops::AttentionOptions o{.causal = true, .deterministic = deterministic_};
  if (dropout_offset && dropout_p_ > 0.0f)
    o.dropout = {.p = dropout_p_,
                 .masks = dropout_by_index_ ? ops::DropoutMasks::ByIndex : ops::DropoutMasks::Device,
                 .seed = seed_, .offset = *dropout_offset, .heads = n_ * tp_.size(),
                 .head_offset = n_ * tp_.rank(), .seq = s * cp_.size()};
  return o;
}

void SelfAttention::cp_forward(Context& ctx, AttentionSaved& saved, Tensor q, Tensor k, Tensor v) const {
  saved.cp = parallel::cp_attention_forward(ctx, cp_, cp_type_, saved.out, q, k, v, saved.options);
}

void SelfAttention::forward_cached(Context& ctx, const Tensor& out, const Tensor& qkv, KvCache& cache,
                                   int64_t position) const {
  const int64_t b = qkv.dim(0), s = qkv.dim(1);
  MEGATRON_CHECK(!tp_.enabled(), "SelfAttention: generation with a key/value cache runs at TP = 1");
  MEGATRON_CHECK(cache.k.rank() == 4 && cache.k.dim(0) == b && cache.k.dim(2) == g_ && cache.k.dim(3) == d_ &&
                     cache.v.shape() == cache.k.shape() && position >= 0 && position + s <= cache.k.dim(1),
                 "SelfAttention: cache ", cache.k.describe(), " cannot take ", s, " tokens at position ", position,
                 " of ", b, " sequences with ", g_, " query groups of ", d_);
  const DType dt = qkv.dtype();
  Tensor q = ctx.empty({b, s, n_, d_}, dt), k = ctx.empty({b, s, g_, d_}, dt), v = ctx.empty({b, s, g_, d_}, dt);
  split_heads(ctx, q, k, v, qkv, rope(position), nullptr, nullptr);
  for (int64_t i = 0; i < b; ++i) {
    ops::copy(ctx, cache.k.select(i).slice(position, position + s), k.select(i));
    ops::copy(ctx, cache.v.select(i).slice(position, position + s), v.select(i));
  }
  Tensor core = ctx.empty({b, s, n_, d_}, dt);
  ops::cached_attention(ctx, core, q, cache.k, cache.v, position + s, position);
  linear_forward(ctx, out, core.view({b, s, n_ * d_}), linear_proj.weight, &linear_proj.bias);
}

void SelfAttention::core_forward(Context& ctx, AttentionSaved& saved) const {
  if (cp_.enabled() && saved.cu_seqlens.defined()) {
    saved.cp = parallel::cp_packed_attention_forward(ctx, cp_, saved.out, std::exchange(saved.q, Tensor()),
                                                     std::exchange(saved.k, Tensor()), std::exchange(saved.v, Tensor()),
                                                     saved.cu_seqlens, saved.options);
  } else if (cp_.enabled()) {
    cp_forward(ctx, saved, std::exchange(saved.q, Tensor()), std::exchange(saved.k, Tensor()),
               std::exchange(saved.v, Tensor()));
  } else if (saved.cu_seqlens.defined()) {
    ops::attention_forward_varlen(ctx, token_rows(saved.out), saved.stats, token_rows(saved.q), token_rows(saved.k),
                                  token_rows(saved.v), saved.cu_seqlens, saved.cu_seqlens, saved.options);
  } else {
    ops::attention_forward(ctx, saved.out, saved.stats, saved.q, saved.k, saved.v, saved.options);
  }
}

void SelfAttention::core_backward(Context& ctx, AttentionSaved& a, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                  const Tensor& dattn) const {
  const ops::AttentionOptions& options = a.options;
  if (a.cp && a.cu_seqlens.defined())
    parallel::cp_packed_attention_backward(ctx, cp_, std::move(*a.cp), dq, dk, dv, dattn, a.cu_seqlens, options);
  else if (a.cp)
    parallel::cp_attention_backward(ctx, cp_, cp_type_, std::move(*a.cp), dq, dk, dv, dattn, options);
  else if (a.cu_seqlens.defined())
    ops::attention_backward_varlen(ctx, token_rows(dq), token_rows(dk), token_rows(dv), token_rows(dattn),
                                   token_rows(a.q), token_rows(a.k), token_rows(a.v), token_rows(a.out), a.stats,
                                   a.cu_seqlens, a.cu_seqlens, options);
  else
    ops::attention_backward(ctx, dq, dk, dv, dattn, a.q, a.k, a.v, a.out, a.stats, options);
}

AttentionSaved SelfAttention::forward(Context& ctx, const Tensor& out, const Tensor& x, int64_t seq, KvCache* cache,
                                      int64_t position, const Tensor& positions, const Tensor& cu_seqlens,
                                      std::optional<uint64_t> dropout_offset) const {
  if (seq == 0) {
    MEGATRON_CHECK(x.rank() == 3, "SelfAttention: x ", x.describe(), " must be [b, s, h] when no sequence length is given");
    seq = x.dim(1);
  }
  const int64_t tokens = x.shape().rows() * (tp_.sp() ? tp_.size() : 1);  // whole sequences after the gather
  MEGATRON_CHECK(seq > 0 && tokens % seq == 0, "SelfAttention: ", tokens, " token rows are not whole sequences of ", seq);
  const int64_t b = tokens / seq, s = seq, r = n_ / g_;
  const DType dt = x.dtype();
  AttentionSaved saved;
  Tensor qkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  saved.qkv_input = linear_qkv.forward(ctx, qkv, x);
  if (cache != nullptr) {
    MEGATRON_CHECK(!cp_.enabled(), "SelfAttention: generation with a key/value cache runs without context parallelism");
    forward_cached(ctx, out, qkv, *cache, position);
    return AttentionSaved{};
  }

  saved.out = ctx.empty({b, s, n_, d_}, dt);
  saved.cu_seqlens = cu_seqlens;
  saved.options = core_options(dropout_offset, s);
  // Attention dropout's masks are addressed by position in the whole [b, heads, s, s] score tensor: the packed
  // (per-document) core draws each document's from its place in it (attention_varlen.h); the context-parallel
  // packed core does not draw them.
  MEGATRON_CHECK(!cu_seqlens.defined() || !saved.options.dropout.enabled() || !cp_.enabled(),
                 "attention dropout with packed documents (--reset-attention-mask, --sft) under context parallelism "
                 "is not supported yet: pass --attention-dropout 0, or run packed documents without CP");
  // Under CP the core makes its own statistics; packed documents keep them as [n, b * s].
  if (!cp_.enabled()) saved.stats = ctx.empty(cu_seqlens.defined() ? Shape{n_, b * s} : Shape{b, n_, s, 1}, DType::F32);
  if (packed() && !cu_seqlens.defined()) {  // MHA without RoPE: q, k, v read inside the fused projection's output
    saved.qkv = qkv;
    ops::attention_forward_packed(ctx, saved.out, saved.stats, qkv, saved.options);
  } else {
    // Split the fused projection into heads, rotating q and k on the way (layout in ops/qkv/qkv.h).
    saved.q = ctx.empty({b, s, n_, d_}, dt);
    saved.k = ctx.empty({b, s, g_, d_}, dt);
    saved.v = ctx.empty({b, s, g_, d_}, dt);
    saved.positions = positions;
    const bool per_token = positions.rank() == 2;
    split_heads(ctx, one_row(saved.q, per_token), one_row(saved.k, per_token), one_row(saved.v, per_token),
                one_row(qkv, per_token), rope(0, per_token ? positions.view({b * s}) : positions), &saved.q_norm,
                &saved.k_norm);
    core_forward(ctx, saved);
  }
  saved.proj_input = linear_proj.forward(ctx, out, saved.out.view({b, s, n_ * d_}));
  return saved;
}

void SelfAttention::backward(Context& ctx, AttentionSaved&& saved, const Tensor& dx, const Tensor& dout) {
  AttentionSaved a = std::move(saved);
  MEGATRON_CHECK(a.out.defined(), "SelfAttention: backward without a forward's saved state");
  const int64_t b = a.out.dim(0), s = a.out.dim(1), r = n_ / g_;
  const DType dt = a.out.dtype();
  const ops::AttentionOptions options = a.options;

  Tensor dattn = ctx.empty({b, s, n_, d_}, dt);
  linear_proj.backward(ctx, std::move(a.proj_input), dattn.view({b, s, n_ * d_}), dout);

  Tensor dqkv = ctx.empty({b, s, g_ * (r + 2) * d_}, dt);
  if (a.qkv.defined()) {
    ops::attention_backward_packed(ctx, dqkv, dattn, a.qkv, a.out, a.stats, options);
  } else {
    Tensor dq = ctx.empty({b, s, n_, d_}, dt), dk = ctx.empty({b, s, g_, d_}, dt), dv = ctx.empty({b, s, g_, d_}, dt);
    core_backward(ctx, a, dq, dk, dv, dattn);
    // Rotate dq and dk back and pack the three into the fused layout (the split's transpose).
    const bool per_token = a.positions.rank() == 2;
    merge_heads_backward(ctx, one_row(dqkv, per_token), one_row(dq, per_token), one_row(dk, per_token),
                         one_row(dv, per_token), rope(0, per_token ? a.positions.view({b * s}) : a.positions),
                         std::move(a.q_norm), std::move(a.k_norm));
  }
  a = AttentionSaved{.qkv_input = std::move(a.qkv_input)};  // the attention's tensors are no longer needed
  linear_qkv.backward(ctx, std::move(a.qkv_input), dx, dqkv);
}

void SelfAttention::collect_parameters(ParameterList& out) {
  linear_qkv.collect_parameters(out);
  linear_proj.collect_parameters(out);
  if (q_layernorm.defined()) {
    q_layernorm.collect_parameters(out);
    k_layernorm.collect_parameters(out);
  }
}

}  // namespace megatron::nn
