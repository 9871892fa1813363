// Context-parallel attention over packed documents (--reset-attention-mask with --context-parallel-size):
// the tokens keep Megatron's load-balanced split of each row (context_parallel.h: rank r holds chunks r and
// 2P-1-r of c = S / 2P tokens), and attention stays inside each document of the whole row.
//
// How: the keys and values of the whole rows are all-gathered over the CP group (cp_all_gather_attention.h);
// each local chunk [a0, a1) of a row attends, document by document, to the keys of its own documents up to
// the chunk's end: a document [d0, d1) overlapping the chunk has queries [max(d0, a0), min(d1, a1)) and keys
// [d0, min(d1, a1)), whose causal mask is bottom-right aligned. The chunk's documents are consecutive, so its
// queries and keys are two contiguous ranges and one packed call (ops/attention/attention_varlen.h) computes
// them; no score across documents is computed. Backward: each chunk's key/value gradients add up over the
// gathered rows and a reduce-scatter hands every rank the sums for its own chunks. Every --cp-comm-type runs
// this form when documents are packed (the ring and the all-to-all do not carry document masks yet).
// Megatron's own THD path splits every document into 2P chunks instead (padding each to a multiple of 2P);
// keeping the row split here needs no padding and gives the same function as CP = 1.
//
// Shapes: q, out, dq, dout [B, 2c, H, D]; k, v, dk, dv [B, 2c, G, D] (this rank's chunks of B rows);
// cu_seqlens host I64: the documents of the B whole rows as offsets into their B * S tokens (a row boundary is
// a document boundary). Saved stats are [B, 2, H, c] F32 (one packed call's [H, c] per row and chunk).
#pragma once

#include "megatron/parallel/context_parallel.h"
#include "megatron/parallel/cp_attention.h"

namespace megatron::parallel {

[[nodiscard]] CpAttentionSaved cp_packed_attention_forward(Context& ctx, const ContextParallel& cp, const Tensor& out,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const Tensor& cu_seqlens, const ops::AttentionOptions& options);

void cp_packed_attention_backward(Context& ctx, const ContextParallel& cp, CpAttentionSaved&& saved, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& cu_seqlens,
                                  const ops::AttentionOptions& options);

}  // namespace megatron::parallel
