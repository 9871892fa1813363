// Context parallelism's all_gather type (Transformer Engine's AttnFuncWithCPAndKVAllGather): the keys and
// values of whole sequences are all-gathered over the P ranks of `group`, and each of this rank's two
// query chunks (r and 2P-1-r, context_parallel.h) attends causally over the prefix of keys it can see,
// [0, (chunk + 1) c), with the mask's bottom-right alignment (ops/attention.h) putting the chunk at the
// prefix's end. Backward: the keys and values are gathered again, each chunk's dk/dv add up over the whole
// sequence, and a reduce-scatter hands every rank the sum for its own chunks.
// Simpler than the ring and with no merge, at the price of holding the whole sequence's keys and values
// (P times the local K/V) during the layer's attention, and of communication not overlapped with compute.
//
// Shapes as in ring_attention.h: q, out, dq, dout [B, 2c, H, D]; k, v, dk, dv [B, 2c, G, D]; stats
// [B, H, 2c, 1] F32; all assigned. options.causal must be true.
#pragma once

#include "megatron/comm/communicator.h"
#include "megatron/ops/attention/attention.h"

namespace megatron::parallel {

// Rank j's local rows [0, c) and [c, 2c) are chunks chunk_of(j, 0, P) = j and chunk_of(j, 1, P) = 2P-1-j.
int64_t chunk_of(int rank, int half, int P);
// The whole sequences' x ([B, S, G, D], natural order) from every rank's local x ([B, 2c, G, D]).
Tensor gather_sequence(Context& ctx, comm::Communicator& group, const Tensor& x);
// Every rank's sum of `whole` ([B, S, G, D]) over the group, at its own chunks: out [B, 2c, G, D], assigned.
void reduce_scatter_sequence(Context& ctx, comm::Communicator& group, const Tensor& out, const Tensor& whole);

void all_gather_attention_forward(Context& ctx, comm::Communicator& group, const Tensor& out, const Tensor& stats,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionOptions& options);

void all_gather_attention_backward(Context& ctx, comm::Communicator& group, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& stats,
                                   const ops::AttentionOptions& options);

}  // namespace megatron::parallel
