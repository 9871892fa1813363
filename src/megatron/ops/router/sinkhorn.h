// Sinkhorn routing of a Mixture-of-Experts router (Megatron-LM's --moe-router-load-balancing-type sinkhorn):
// the balancing of moe_utils.py's sinkhorn(cost), and the gates at the experts it chooses.
//
// router_sinkhorn(balanced [T, E], logits [T, E]) assigns Megatron's sinkhorn(exp(logits)) (its router calls it
// on the fp32 logits, under no_grad):
//   d1 = 1;  repeat   d0_t = (1/T) * 1 / (sum_e d1_e cost_te + 1e-8)
//                     d1_e = (1/E) * 1 / (sum_t d0_t cost_te + 1e-8)
//                     error = mean_e |d1_e - d1_e before|
//            while error > 1e-4, at most kSinkhornMaxIterations times (Megatron has no cap; a positive cost
//            matrix converges in a few dozen)
//   balanced_te = (d1_e * cost_te) * d0_t,   cost = exp(logits).
// Arithmetic is fp32 for F32 / BF16 / F16 logits (Megatron's dtype here) and fp64 for F64 logits (CPU only),
// with router_math.h's correctly rounded operations and exp; 1/T and 1/E (formed in fp64, as Megatron's Python
// scalars are), 1e-8 and 1e-4 are rounded to the arithmetic type. The sums run in one fixed order on both
// devices, so CPU and CUDA give the same bits:
//   a row's sum over e: in order e = 0 .. E-1;
//   column e's sum over t: the rows cut into chunks of R = sinkhorn_chunk_rows(T) (the last may be shorter),
//   each chunk summed in order of t, then the chunk sums added in order of the chunk;
//   the error: the |differences| added in order e = 0 .. E-1, then divided by E.
// The CUDA path is one cooperative launch that iterates on the device, its blocks meeting at grid-wide
// barriers (rows, chunks, then one block's column totals and stopping test): no host synchronisation.
//
// router_scores_at(probs [T, k], scores [T, E], indices [T, k]): probs_tj = scores[t, indices_tj] (the gates of
// the chosen experts: Sinkhorn routing gates with the plain activation, not the balanced costs). An index
// outside [0, E): the CPU throws naming the entry, CUDA writes NaN there.
//
// Dtypes: logits F32 / BF16 / F16 (F64 on the CPU); balanced F32 (F64 with F64 logits); scores and probs F32
// (F64 on the CPU); indices I32 in [0, E). E <= 2048 on CUDA. T == 0 is a no-op.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops {

inline constexpr int kSinkhornMaxIterations = 1000;
// Rows per chunk of the column sums: at least 64 (a chunk is one thread's sequential sum on CUDA), and at most
// 256 chunks (one thread adds a column's chunk sums in sequence).
inline constexpr int64_t sinkhorn_chunk_rows(int64_t T) { return T / 256 >= 64 ? (T + 255) / 256 : 64; }

void router_sinkhorn(Context& ctx, const Tensor& balanced, const Tensor& logits);
void router_scores_at(Context& ctx, const Tensor& probs, const Tensor& scores, const Tensor& indices);

}  // namespace megatron::ops
