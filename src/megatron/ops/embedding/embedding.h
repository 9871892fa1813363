// Token embedding: a gather of table rows and its gradient, a deterministic scatter-add.
//
// Shapes and dtypes (V vocabulary rows, H hidden size; ids may have any shape S, e.g. [T] or [B, S]):
//   weight   [V, H]     F32, BF16, F16 (CUDA and CPU) or F64 (CPU only)
//   ids      S          I32 or I64, each in [0, V)
//   out      S + [H]    same dtype as weight
//   dout     S + [H]    F32, BF16, F16 (F64 on the CPU)
//   dweight  [V, H]     F32 (F64 allowed on the CPU when dout is F64)
//
// embedding_forward assigns out[i, :] = weight[ids[i], :] (a copy, bit exact).
// embedding_backward computes G[v, :] = sum over i with ids[i] == v of dout[i, :] (fp32 on CUDA, double on
// the CPU) and assigns dweight = G (accumulate = false; rows no token uses become 0) or adds dweight += G
// (accumulate = true, e.g. into a main-grad buffer).
//
// Determinism: the CUDA backward sorts the token positions by id (cub::DeviceRadixSort, stable) and sums each
// id's rows in increasing position order, one owner per output element, without atomics: the result is
// bitwise identical run to run. The CPU sums in position order too.
//
// ids out of range: the CPU validates every id and throws naming the position and the value. On CUDA, ids
// must be in range; the kernels never read or write outside the tables: forward fills the row of a bad id
// with NaN (so the mistake shows in the loss), backward drops that token's gradient.
//
// Vocabulary-parallel forms (tensor parallelism, Megatron's VocabParallelEmbedding): `weight` / `dweight` hold
// rows [vocab_start, vocab_start + V) of a table of global_vocab rows and ids are global, in [0, global_vocab)
// (the same out-of-range rules as above apply to the global range). An id outside this shard gives a zero
// row in the forward (the ranks' outputs then sum to the whole lookup) and no gradient in the backward.
// With vocab_start 0 and global_vocab V they are embedding_forward / embedding_backward.
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops {

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids);

void embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate);

void vocab_parallel_embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids,
                                      int64_t vocab_start, int64_t global_vocab);
void vocab_parallel_embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids,
                                       bool accumulate, int64_t vocab_start, int64_t global_vocab);

}  // namespace megatron::ops
