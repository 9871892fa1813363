// Variable-length ("THD", packed) attention: several sequences packed one after another along the token
// dimension, each attending only to its own keys, as flash attention's varlen functions and cuDNN's ragged
// offsets define it.
//
// Layout:
//   q, out, dq, dout : [Tq, H, D]     sequence i is rows [cu_seqlens_q[i], cu_seqlens_q[i + 1])
//   k, v, dk, dv     : [Tkv, G, D]    and its keys rows [cu_seqlens_kv[i], cu_seqlens_kv[i + 1]); H % G == 0
//   cu_seqlens_q/_kv : host I64 [N + 1], non-decreasing, from 0 to Tq and Tkv (every row belongs to one
//                      sequence; a sequence may be empty)
//   stats            : [H, Tq] F32, the log-sum-exp of each query row (attention.h's stats of a B = 1 batch)
// Sequence i computes exactly attention_forward/backward (attention.h) of its own rows as a batch of one, so a
// packed batch equals its sequences run one by one: causal is bottom-right aligned within each sequence
// (query j of a sequence with Lq queries and Lkv keys sees its keys m <= j + Lkv - Lq; self-attention has
// Lq == Lkv), which needs Lkv >= Lq; a sequence with queries needs keys. No score across sequences is computed.
// Forward assigns out and stats; backward assigns dq, dk, dv (keys no query sees get zero).
//
// Dropout (options.dropout, attention_dropout.h): the packed rows are the micro-batch [B, seq] flattened, seq =
// dropout.seq (> 0): row r of q and of k/v is position r % seq of P's sequence r / seq, and every sequence's
// queries and keys lie inside one of P's sequences (the documents of a sample; dropout.queries, keys and
// batch_offset must be left empty / 0). Each sequence then draws the masks its rows have in P -- what dense
// attention over the whole [B, seq] batch draws for those scores: by index on the CPU; on CUDA with cuDNN's
// Philox (DropoutMasks::Device, one stream per call). ByIndex masks over packed sequences are refused on CUDA.
//
// Devices: CPU (the reference; F64, F32, BF16, F16, precision as attention.h). CUDA: BF16 and F16 through cuDNN's
// fused attention with ragged offsets (cudnn_sdpa.cpp; attention.h's limits on the head dimension and alignment;
// deterministic selects cuDNN's deterministic backward).
#pragma once

#include "megatron/ops/attention/attention.h"

namespace megatron::ops {

void attention_forward_varlen(Context& ctx, const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                              const AttentionOptions& options = {});

void attention_backward_varlen(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& stats, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv,
                               const AttentionOptions& options = {});

// The (query, key) pairs the packed attention computes: sum over sequences of Lq * Lkv, causal counting only
// the visible pairs (Lq (Lq + 1) / 2 + Lq (Lkv - Lq)). What the FLOP count of packed batches uses.
double attention_varlen_pairs(const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv, bool causal);

}  // namespace megatron::ops
