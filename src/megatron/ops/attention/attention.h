// Causal (or full) scaled-dot-product attention with grouped-query heads, as a fused op.
//
// Layout ("bshd", Megatron's layout before the attention core):
//   q, out, dq, dout : [B, Sq, H, D]
//   k, v, dk, dv     : [B, Skv, G, D]   H % G == 0; query head h reads key/value head h / (H / G)
//                                       (G == H: multi-head, G == 1: multi-query)
//   stats            : [B, H, Sq, 1] f32 log-sum-exp of each query row of the scaled, masked scores
//                                       (natural log): stats = log(sum_j exp(scale * q_i . k_j)).
//                                       Context parallelism merges partial results with it
//                                       (attention_merge.h).
// Self-attention has Sq == Skv; context parallelism attends blocks of a sequence to other blocks.
// All of q, k, v, out, dout, dq, dk, dv share one dtype. Scale = options.scale, or 1/sqrt(D) when 0.
// Causal mask, bottom-right aligned: query i sees keys j <= i + (Skv - Sq), i.e. the queries are the last
// Sq positions of the keys' sequence (flash attention's and cuDNN's convention); with Sq == Skv that is the
// usual query i sees keys j <= i. Causal needs Skv >= Sq. Full (causal = false): every query sees every
// key, any Sq and Skv >= 1. Dropout (options.dropout, attention_dropout.h): the normalised probabilities
// masked and scaled by 1 / (1 - p) before the P.V product, the mask addressed by each probability's place in
// the whole model's tensor (DropoutMasks::ByIndex, and always on the CPU) or by cuDNN's own generator
// (DropoutMasks::Device on CUDA); the stats stay the undropped scores' log-sum-exp.
// Empty problems (Sq == 0, B == 0, H == 0) compute nothing; their backward assigns dk = dv = 0.
//
// Forward assigns out and stats. Backward assigns (does not accumulate) dq, dk, dv, recomputing the
// probabilities from stats: P = exp(scale * Q K^T - stats), dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO; for grouped heads dK/dV sum over the group's heads. With
// dropout the backward regenerates the forward's mask M (same options.dropout): dP = (dO V^T) o M / (1 - p),
// dV = (P o M / (1 - p))^T dO.
//
// Devices and precision:
//   CPU : F64, F32, BF16, F16 storage; blocked BLAS products (dgemm) with a fused softmax, double
//         throughout, outputs rounded once (attention/cpu.cpp says why not fp32). The reference.
//   CUDA: BF16 and F16 only (F32/F64 throw), through cuDNN's fused flash attention (cudnn-frontend
//         graphs, cached per shape/dtype/options in the context). fp32 accumulation and softmax; the
//         probabilities are rounded to the I/O type before the P.V and dS products (flash attention).
//         Needs D % 8 == 0, D <= 256, and 16-byte aligned tensors. A single key (Skv == 1, any Sq: cuDNN's
//         backward rejects Sq == Skv == 1 and returns non-finite dq/dk for Skv == 1 < Sq) runs small
//         kernels of ours in both directions, fp32 math; every other shape, Sq == 1 < Skv included, runs in
//         cuDNN, and where the installed cuDNN has no kernel for a shape the op throws with cuDNN's reason,
//         the step that failed and the shape. Causal with
//         Sq < Skv uses cuDNN's bottom-right diagonal alignment (cuDNN >= 9.6 for lengths that are not
//         multiples of 64); Sq == Skv keeps the top-left graph.
//         deterministic=true selects cuDNN's deterministic backward (bit-identical reruns; slower).
//         Dropout runs in cuDNN (attention_dropout.h says which generator draws the mask) except where cuDNN
//         has none: a single key (Skv == 1) and causal attention with Sq < Skv (bottom-right alignment) throw.
#pragma once

#include "megatron/ops/attention/attention_dropout.h"
#include "megatron/runtime/context.h"

namespace megatron::ops {

struct AttentionOptions {
  bool causal = true;
  float scale = 0.0f;          // 0: 1/sqrt(D)
  bool deterministic = false;  // backward only
  AttentionDropout dropout;    // p = 0: none; the backward must get the forward's
};

void attention_forward(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& options = {});

void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats,
                        const AttentionOptions& options = {});

// Packed variants, for multi-head attention (G == H) without rotary embeddings: there the fused QKV
// projection's output, Megatron's layout with one query head per group,
//   qkv [B, S, H * 3 * D]  = per token and head: q (D), k (D), v (D),
// is already a strided bshd layout that cuDNN reads in place, so nothing is split or merged: the forward
// reads q, k, v where they lie, the backward writes dq, dk, dv into dqkv (same layout, assigned). out, dout,
// stats and the options are as above; H and D come from out [B, S, H, D].
// CPU: the reference split into q, k, v (ops/qkv), then the functions above.
void attention_forward_packed(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& qkv,
                              const AttentionOptions& options = {});
void attention_backward_packed(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& out, const Tensor& stats, const AttentionOptions& options = {});

// The scale actually used for head dimension `head_dim` (options.scale, or 1/sqrt(head_dim) when 0).
float attention_scale(const AttentionOptions& options, int64_t head_dim);

}  // namespace megatron::ops
