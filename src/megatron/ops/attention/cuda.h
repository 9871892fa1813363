// CUDA path of the attention family (see attention.h): cuDNN fused attention (cudnn_sdpa.cpp) plus one
// kernel of ours for what cuDNN does not cover (cuda.cu). Arguments are validated by the caller, except the
// cuDNN-specific limits (dtype, head dim, alignment), which are checked here.
#pragma once

#include "megatron/ops/attention/attention_dropout.h"
#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

// `dropout` (enabled or not) as attention_dropout.h says: cuDNN's own Philox (DropoutMasks::Device) or a custom
// mask written by attention_dropout_mask (ByIndex). The caller refuses dropout where cuDNN has none (a single key,
// bottom-right causal alignment).
void attention_forward(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, float scale, const AttentionDropout& dropout);
void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                        bool causal, float scale, bool deterministic, const AttentionDropout& dropout);

// qkv [B, S, H * 3 * D] read in place (strided), dqkv written in place; S > 1.
void attention_forward_packed(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& qkv, bool causal,
                              float scale, const AttentionDropout& dropout);
void attention_backward_packed(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& stats, bool causal, float scale, bool deterministic,
                               const AttentionDropout& dropout);

// attention_dropout_mask (attention_dropout.h) on CUDA (attention_dropout.cu); arguments validated by the caller.
void attention_dropout_mask(Context& ctx, const Tensor& mask, const AttentionDropout& dropout, bool causal);

// Packed (THD) sequences (attention_varlen.h): q/out/dq/dout [Tq, H, D], k/v/dk/dv [Tkv, G, D], stats [H, Tq],
// cu_seqlens host i64 [N + 1]; BF16/F16 through cuDNN's fused attention with ragged offsets (cudnn_sdpa.cpp).
// Dropout: cuDNN's Philox only (the caller refuses ByIndex masks here).
void attention_forward_varlen(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv, bool causal,
                              float scale, const AttentionDropout& dropout);
void attention_backward_varlen(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& stats, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                               bool causal, float scale, bool deterministic, const AttentionDropout& dropout);

// Forward and backward for a single key (Skv == 1, any Sq; causal then means Sq == 1 too, so the mask is
// irrelevant), BF16/F16; deterministic.

void attention_forward_single_token(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q,
                                    const Tensor& k, const Tensor& v, float scale);
void attention_backward_single_token(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                     const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& stats, float scale);

// attention_merge (attention_merge.h) with F32, BF16 or F16 out and F32 stats (attention_merge.cu);
// arguments validated by the caller.
void attention_merge(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& part,
                     const Tensor& part_stats, int64_t row_begin);

}  // namespace megatron::ops::cuda
