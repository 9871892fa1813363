// Ring attention: context parallelism's p2p type (Transformer Engine's AttnFuncWithCPAndKVP2P, Megatron's
// default --cp-comm-type), for causal attention over sequences split over the P ranks of `group` in the
// load-balanced layout (context_parallel.h): rank r holds chunks r and 2P-1-r of c tokens each,
// [q_a ; q_b] = [chunk r ; chunk 2P-1-r].
//
// Forward: the ranks' keys and values travel around the ring (rank r sends to r+1, receives from r-1), the
// next block in flight while the current one is computed; at step i rank r holds the block of rank
// j = (r - i) mod P and computes
//   i == 0      its own block: causal attention of [q_a ; q_b] over [k_a ; k_b] (chunk r precedes chunk
//               2P-1-r, so the ordinary causal mask over the local sequence is the right one);
//   j < r       every local query over j's first chunk only (chunk j precedes both local chunks; j's second
//               chunk, 2P-1-j, follows both): full attention of [q_a ; q_b] over k_j,a;
//   j > r       the second local chunk over both of j's chunks (both precede chunk 2P-1-r; neither precedes
//               chunk r): full attention of q_b over [k_j,a ; k_j,b];
// and merges each partial result into out/stats through the log-sum-exp (ops/attention_merge.h). Every
// block is one fused attention call of half or whole local size, and no block is masked-out work: the
// ranks share the causal work equally.
// Backward: the same blocks with the merged out and stats (so each block's probabilities are the final
// ones), the keys and values travelling around the ring again; dq accumulates locally, and each block's
// dk/dv accumulate into a buffer that travels with it and arrives back at its owner after the last step.
//
// Attention dropout (options.dropout): each block's call draws the probabilities of its queries and keys at
// their places in the whole sequence, the ring's load-balanced layout of P ranks x 2 chunks of c positions
// (options.dropout.seq must be 2Pc; its head addressing is the caller's, its query and key runs are replaced):
// the masks of one rank attending the whole sequence.
// Shapes: q, out, dq, dout [B, 2c, H, D]; k, v, dk, dv [B, 2c, G, D]; stats [B, H, 2c, 1] F32; all
// assigned. group null or of size 1: plain causal attention. Outputs and accumulators stay in the I/O dtype
// with fp32 math (one rounding per merge or addition). Deterministic when options.deterministic.
#pragma once

#include "megatron/comm/communicator.h"
#include "megatron/ops/attention/attention.h"
#include "megatron/parallel/peer_exchange.h"
#include "megatron/parallel/stream_fork.h"

namespace megatron::parallel {

// Where a rank is in the ring: its rank, the ring size, and the step (whose block it holds: owner()).
struct RingStep {
  int rank = 0, size = 1, step = 0;
  int owner() const { return (rank - step + size) % size; }
};

// One rank's work at one step, without communication (exposed so that one device can run every rank's steps:
// tests, and the benchmark of the ring's cost against one whole-sequence call).
// Forward: step 0 assigns out and stats (the causal diagonal block); later steps merge their block in.
void ring_attention_forward_step(Context& ctx, const RingStep& at, const Tensor& out, const Tensor& stats,
                                 const Tensor& q, const Tensor& k_block, const Tensor& v_block,
                                 const ops::AttentionOptions& options);
// Backward: step 0 assigns dq, later steps add into it; returns the block's key/value gradients, which
// cover the block's rows [0, dk.dim(1)) (the first chunk only when only that was attended).
struct RingBlockGrads {
  Tensor dk, dv;
};
[[nodiscard]] RingBlockGrads ring_attention_backward_step(Context& ctx, const RingStep& at, const Tensor& dq,
                                                          const Tensor& dout, const Tensor& q, const Tensor& k_block,
                                                          const Tensor& v_block, const Tensor& out,
                                                          const Tensor& stats, const ops::AttentionOptions& options);

// The ring's copy-engine transport (--cp-comm-transport copy-engine; peer_exchange.h): each block is pushed
// straight into the next rank's staging slot while the current one is computed, two slots per ring exchange so
// a block can land while the previous one is still read, one exchange for the key/value blocks and one for the
// gradients travelling with them in the backward, and a side stream for the pushes. Made on first use (CUDA);
// where the ranks cannot map each other's memory the exchanges are null and the ring uses NCCL.
struct RingPeers {
  PeerExchangeCache kv{PeerExchangeOptions{.depth = 2, .from_previous_only = true}};
  PeerExchangeCache grads{PeerExchangeOptions{.depth = 2, .from_previous_only = true}};
  std::unique_ptr<StreamFork> side;  // made with the first exchange
};

// `peers` (null: NCCL point-to-point, or MPI on CPU ranks) moves the blocks by the copy engines on GPUs.
void ring_attention_forward(Context& ctx, comm::Communicator* group, const Tensor& out, const Tensor& stats,
                            const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionOptions& options,
                            RingPeers* peers = nullptr);

void ring_attention_backward(Context& ctx, comm::Communicator* group, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& stats, const ops::AttentionOptions& options,
                             RingPeers* peers = nullptr);

}  // namespace megatron::parallel
