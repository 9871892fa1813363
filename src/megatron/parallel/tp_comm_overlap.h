// Tensor-parallel communication overlapped with the GEMMs (Megatron's --tp-comm-overlap, which Megatron hands to
// Transformer Engine's userbuffers), for sequence parallelism: the collectives around the column-/row-parallel
// GEMMs are cut into TP ring steps, each chunk's GEMM running while the next chunk travels.
//
//   pipelined all-gather (column-parallel forward; row-parallel input-gradient GEMM): rank r starts with its own
//     chunk, sends it to r + 1 and receives r - 1's while it multiplies its own; then the received one, and so
//     on around the ring: TP GEMMs of rows / TP rows, TP - 1 transfers hidden behind them.
//   pipelined reduce-scatter (row-parallel forward; the column-parallel input gradient with rs_dgrad): rank r
//     computes its partial product for chunk r - 1 first and sends it on; each later step adds its own partial
//     for the next chunk to the sum arriving from r - 1 and passes it on, so the sum for chunk r ends on rank r
//     after TP - 1 transfers, each behind the next chunk's GEMM. The sums run in another order than the
//     communicator's reduce-scatter: results equal the non-overlapped path to rounding (bitwise for the
//     all-gathers, whose GEMMs see the same rows).
//   bulk overlaps (column-parallel backward, on by default even without --tp-comm-overlap): the saved input's
//     all-gather while the input-gradient GEMM runs (bulk_dgrad), and the input gradient's reduce-scatter
//     while the weight-gradient GEMM runs (bulk_wgrad).
//
// Transfers: on CUDA, copy-engine memcpys straight into the peers' staging slots (PeerExchange: every rank
// pushes its chunk to every other rank at once, and each rank sums the partials pushed to it in a fixed order),
// because an NCCL kernel and a GEMM kernel hardly run side by side while a copy engine and a GEMM do; otherwise
// (--tp-comm-overlap-transport nccl, or ranks that cannot map each other's memory) the TP group's batched
// point-to-point around the ring on the group's side stream, and on CPU ranks MPI's nonblocking sends. FP8
// linears keep the plain collectives.
#pragma once

#include <functional>

#include "megatron/runtime/context.h"

namespace megatron::parallel {

struct TensorParallel;

// Which parts run overlapped (all false: the plain collectives; bulk_* are the default path's behaviour).
struct TpCommOverlap {
  bool pipelined_ag = false;  // --tp-comm-overlap without --disable-tp-comm-overlap-ag / -split-ag
  bool pipelined_rs = false;  // --tp-comm-overlap without --disable-tp-comm-overlap-rs / -split-rs
  bool rs_dgrad = false;      // --tp-comm-overlap-rs-dgrad: the column-parallel dx's reduce-scatter pipelined
  bool bulk_dgrad = true;     // --disable-tp-comm-bulk-dgrad turns it off
  bool bulk_wgrad = true;     // --disable-tp-comm-bulk-wgrad turns it off
  // CUDA, with --tp-comm-overlap: the pipelined transfers and the bulk collectives by the copy engines between
  // the GPUs of a node (peer_exchange.h), where the ranks can map each other's memory; false (no
  // --tp-comm-overlap, or --tp-comm-overlap-transport nccl): NCCL (the group's batched point-to-point for
  // the pipelined ones).
  bool copy_engine = false;
};

// Ring all-gather of `shard` ([r, cols] on every rank of tp) fused with per-chunk work: compute(c, chunk) is
// called for chunk c = rank, rank - 1, ... (mod TP), chunk being rank c's shard, while the next one is in
// flight. When `gathered` [TP r, cols] is defined each chunk is also copied into its rows.
void ring_all_gather(Context& ctx, const TensorParallel& tp, const Tensor& shard, const Tensor& gathered,
                     const std::function<void(int chunk, const Tensor& rows)>& compute);

// Ring reduce-scatter fused with per-chunk work: compute(c, partial) assigns this rank's partial result
// ([r, cols], like `out`) for chunk c; `out` receives the sum over the ranks of their partials for chunk
// rank.
void ring_reduce_scatter(Context& ctx, const TensorParallel& tp, const Tensor& out,
                         const std::function<void(int chunk, const Tensor& partial)>& compute);

// Rows [first, first + count) of a row-major tensor viewed as [rows, cols] (a view).
Tensor row_block(const Tensor& t, int64_t cols, int64_t first, int64_t count);

}  // namespace megatron::parallel
