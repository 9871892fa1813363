// SelfAttention: Megatron's self-attention block (linear_qkv -> split -> RoPE -> causal core attention ->
// linear_proj), heads n, query groups g (MHA g == n, GQA, MQA g == 1), head dim d = kv_channels.
//
// Fused QKV weight layout (Megatron-core, [g * (n/g + 2) * d, h]): the rows are grouped per query group;
// group j holds its n/g query heads (d rows each), then its key head, then its value head. Query head
// j * (n/g) + i therefore reads key/value head j, which is the attention op's h / (n/g) rule.
// The split (and RoPE on q and k) is one fused pass, ops::split_qkv_forward; backward merges with
// ops::merge_qkv_backward. Multi-head attention without RoPE (g == n, GPT-2/GPT-3) skips both: with one
// query head per group the fused layout is [b, s, n, 3, d], which the packed attention op reads (and whose
// gradient it writes) in place.
//
// Tensor parallelism (split by heads): linear_qkv is column-parallel and linear_proj row-parallel. Rank r
// holds query groups [r * g / TP, (r + 1) * g / TP) with their query heads and key/value heads: in the fused
// layout that is one contiguous block of rows, so the local QKV projection has the same per-group layout with
// g / TP groups and n / TP heads, and split / RoPE / attention run unchanged on the local heads. linear_proj
// holds the matching columns [r * n d / TP, (r + 1) * n d / TP) and sums the ranks' partial outputs.
//
// forward(ctx, out, x, seq): x holds whole sequences of length seq: [b * s, h] (or [b, s, h]; seq 0 then
//   means x.dim(1)), or under sequence parallelism this rank's token rows [b * s / TP, h]; out like x,
//   assigned (linear_proj's bias included). Returns what backward needs (AttentionSaved): q (after RoPE), k,
//   v (or the packed projection), the attention output and its LSE stats, and the projections' inputs.
//   With a KvCache (generation, TP = 1): x holds the next seq tokens of every sequence, at positions
//   `position` .. position + seq - 1; their keys and values are written into the cache there and the queries
//   attend over the cache's first position + seq entries (ops/attention/cached_attention.h); nothing is saved
//   for a backward.
// backward(ctx, saved, dx, dout): dx like x, assigned; every parameter's main grad accumulated (+=);
//   consumes `saved`.
// Attention dropout (config.attention_dropout, training passes that give a Philox offset): on the softmax
//   probabilities, each addressed by its place in the whole model's [b, heads, S, S] tensor (this rank's heads
//   from rank * n / TP on, its tokens at their positions in the sequence under CP), so every TP and CP layout
//   draws the masks of one rank (ops/attention/attention_dropout.h); the backward regenerates the forward's.
//   On GPUs cuDNN's own generator draws them instead (masks that depend on the layout), unless
//   config.attention_dropout_by_index.
// RoPE (position_embedding_type rope) rotates q and k: rotary_percent, rotary_base, positions 0..s-1 (or
//   `positions`, a device I64 [s], under context parallelism).
// --qk-layernorm (config.qk_layernorm): q_layernorm and k_layernorm (nn/norm.h, per head: weights [d], every
//   head's d channels one row) normalise the split q and k before RoPE; the split and RoPE then run as two
//   passes around the norms, and the norms' inputs are saved for their backward. Their gradients are partial
//   over TP (each rank normalises its own heads) and summed there by finalize_model_grads, as Megatron does.
// Context parallelism (a ContextParallel of size CP > 1): x holds this rank's tokens of each sequence (the
//   load-balanced split of parallel/context_parallel.h), `positions` their positions; q, k, v are split as
//   usual and the attention core runs across the CP group with the layer's communication type
//   (parallel/cp_attention.h). Everything else is token by token and unchanged. Not with a KvCache.
// Documents (trainer/micro_batch.h): `positions` [b, s] gives every token its own RoPE position
//   (--reset-position-ids), and `cu_seqlens` (host I64, the documents of the b whole rows as offsets into their
//   b * S tokens) keeps attention inside each document (--reset-attention-mask): the rows are attended as one
//   packed sequence of documents (ops/attention/attention_varlen.h), no score computed across documents;
//   under context parallelism by parallel/cp_packed_attention.h.
#pragma once

#include <optional>
#include <string>

#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/norm.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/nn/row_parallel_linear.h"
#include "megatron/ops/rope/rope.h"
#include "megatron/parallel/cp_attention.h"

namespace megatron::nn {

struct AttentionSaved {
  LinearSaved qkv_input;      // linear_qkv's input (this rank's token rows under SP)
  Tensor qkv;                 // the packed path: the fused projection, which attention reads in place
  Tensor q, k, v;             // the split path: [b, s, n, d], [b, s, g, d] x 2 (q and k after RoPE)
  NormSaved q_norm, k_norm;   // --qk-layernorm: the per-head norms' inputs and statistics
  Tensor out, stats;          // attention output [b, s, n, d] and its log-sum-exp [b, n, s, 1] (F32)
  ops::AttentionOptions options;  // the core's, dropout addressing included (the backward's must be the same)
  LinearSaved proj_input;     // linear_proj's input (a view of `out`)
  // Context parallelism: the core's tensors in the layout it ran in (q, k, v, stats above stay undefined),
  // and the tokens' positions for RoPE's backward.
  std::optional<parallel::CpAttentionSaved> cp;
  Tensor positions;
  Tensor cu_seqlens;          // documents: the packed attention's offsets (stats are then [n, b * s])
};

// One layer's keys and values for generation: k, v [B, max_length, g, d]; positions before the current call's
// hold the earlier tokens'.
struct KvCache {
  Tensor k, v;
};

class SelfAttention {
 public:
  SelfAttention() = default;
  // `layer`: the global layer number (its context-parallel communication type).
  SelfAttention(Context& ctx, const std::string& name, const TransformerConfig& config,
                const parallel::TensorParallel& tp = {}, const parallel::ContextParallel& cp = {}, int layer = 0);

  void init(Context& ctx, const TransformerConfig& config);
  // `dropout_offset`: the Philox offset of this pass's attention dropout (none: no dropout, as in evaluation).
  [[nodiscard]] AttentionSaved forward(Context& ctx, const Tensor& out, const Tensor& x, int64_t seq = 0,
                                       KvCache* cache = nullptr, int64_t position = 0,
                                       const Tensor& positions = Tensor(), const Tensor& cu_seqlens = Tensor(),
                                       std::optional<uint64_t> dropout_offset = std::nullopt) const;
  void backward(Context& ctx, AttentionSaved&& saved, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  ColumnParallelLinear linear_qkv;  // [g * (n/g + 2) * d / TP, h]
  RowParallelLinear linear_proj;    // [h, n * d / TP]
  Norm q_layernorm, k_layernorm;    // --qk-layernorm only: weights [d] (and biases for LayerNorm)

 private:
  // None without RoPE.
  std::optional<ops::RopeOptions> rope(int64_t position_offset = 0, const Tensor& positions = Tensor()) const;
  // The generation path of forward(): new tokens' keys and values into the cache, attention over it.
  void forward_cached(Context& ctx, const Tensor& out, const Tensor& qkv, KvCache& cache, int64_t position) const;
  bool packed() const { return g_ == n_ && !rope_ && !cp_.enabled() && !q_layernorm.defined(); }
  // The fused projection split into q, k, v (views of [b, s, heads, d]; one_row's under per-token positions):
  // with RoPE in the same pass, or with --qk-layernorm as split, per-head norms, then RoPE in place, the norms'
  // saved state into q_norm / k_norm when given (training).
  void split_heads(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                   const std::optional<ops::RopeOptions>& rope, NormSaved* q_norm, NormSaved* k_norm) const;
  // split_heads' transpose: dq and dk (gradients after RoPE) rotated back, through the norms' backward, and the
  // three packed into dqkv. dq and dk are overwritten.
  void merge_heads_backward(Context& ctx, const Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const std::optional<ops::RopeOptions>& rope, NormSaved&& q_norm, NormSaved&& k_norm);
  // The attention core on split q, k, v (saved's): causal over whole rows, packed documents, or across CP.
  void core_forward(Context& ctx, AttentionSaved& saved) const;
  void core_backward(Context& ctx, AttentionSaved& a, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const Tensor& dattn) const;
  // The context-parallel attention core: saved.out assigned, the core's tensors into saved.cp.
  void cp_forward(Context& ctx, AttentionSaved& saved, Tensor q, Tensor k, Tensor v) const;
  // The attention core's options for sequences of s local tokens, with dropout when given an offset.
  ops::AttentionOptions core_options(std::optional<uint64_t> dropout_offset, int64_t s) const;

  parallel::TensorParallel tp_;
  parallel::ContextParallel cp_;
  parallel::CpCommType cp_type_ = parallel::CpCommType::P2P;
  int64_t n_ = 0, g_ = 0, d_ = 0;  // this rank's heads and groups
  bool rope_ = false;
  bool deterministic_ = false;
  double rotary_percent_ = 1.0, rotary_base_ = 10000.0;
  float dropout_p_ = 0.0f;
  bool dropout_by_index_ = false;
  uint64_t seed_ = 0;
};

}  // namespace megatron::nn
