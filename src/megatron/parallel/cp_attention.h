// Causal attention of this rank's tokens over whole sequences split by context parallelism, in each of
// Megatron's communication types (context_parallel.h): p2p (ring_attention.h), all_gather
// (cp_all_gather_attention.h), a2a (cp_all_to_all.h around ordinary attention) and a2a+p2p (the all-to-all
// over the first hierarchical level around the ring over the second).
//
// forward: q [B, s, H, D], k and v [B, s, G, D] hold this rank's s = S / CP tokens of each sequence (the
//   load-balanced split); out [B, s, H, D] is assigned. Returns what the backward needs: the attention
//   core's inputs and results in the layout it ran in (for a2a, the whole sequences of 1/A of the heads).
// backward: consumes them; dq, dk, dv (shaped like q, k, v) assigned from dout.
// Attention dropout (options.dropout, ops/attention/attention_dropout.h): the caller addresses this rank's heads
// in the whole model (heads, head_offset; heads 0: q's) and the whole sequence (seq = S; 0: CP x q's tokens);
// every type then draws each
// probability at its query's and key's places in the sequence (and, after a2a's all-to-all, its head's), so
// every type and CP size draws the masks of one rank.
#pragma once

#include "megatron/ops/attention/attention.h"
#include "megatron/parallel/context_parallel.h"

namespace megatron::parallel {

struct CpAttentionSaved {
  Tensor q, k, v, out, stats;
};

[[nodiscard]] CpAttentionSaved cp_attention_forward(Context& ctx, const ContextParallel& cp, CpCommType type,
                                                    const Tensor& out, const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const ops::AttentionOptions& options);

void cp_attention_backward(Context& ctx, const ContextParallel& cp, CpCommType type, CpAttentionSaved&& saved,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                           const ops::AttentionOptions& options);

}  // namespace megatron::parallel
