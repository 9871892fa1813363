// TensorParallel: what a tensor-parallel module needs to know about its group, as a value (no globals):
// the TP communicator (ParallelContext::tp()), whether sequence parallelism is on, and the side stream its
// collectives overlap on (CUDA).
//
// Sequence-parallel region: activations outside the column-/row-parallel pairs (norms, dropout, the
// residual stream, the embedding output) are sharded along the token dimension. Tensors here are
// row-major [b * s, h] (batch-major; Megatron's are [s, b, h]), so the shard is a contiguous block of rows:
// rank r holds token rows [r * T / TP, (r + 1) * T / TP) of T = b * s. With b = 1 (the usual large-model
// case) that is exactly Megatron's sequence shard; with b > 1 it is a different but equally sized set of
// tokens. Everything in the region works token by token, so the math is the same; Megatron's constraint
// (seq divisible by TP) guarantees T divides.
//
// A TensorParallel of size 1 (the default value) makes every mapping a no-op without a call into the
// communicator: TP = 1 costs nothing.
#pragma once

#include <cstdint>
#include <memory>

#include "megatron/comm/communicator.h"
#include "megatron/parallel/peer_exchange.h"
#include "megatron/parallel/stream_fork.h"
#include "megatron/parallel/tp_comm_overlap.h"

namespace megatron::parallel {

struct TensorParallel {
  std::shared_ptr<comm::Communicator> group;  // null: no tensor parallelism
  bool sequence_parallel = false;             // effective only with size() > 1 (Megatron turns it off at TP 1)
  std::shared_ptr<StreamFork> overlap;        // CUDA side stream for overlapped collectives; null: none
  TpCommOverlap comm_overlap;                 // which collectives run pipelined with the GEMMs (tp_comm_overlap.h)
  std::shared_ptr<PeerExchangeCache> peers;       // CUDA: copy-engine transfers of the pipelined collectives
  std::shared_ptr<PeerExchangeCache> bulk_peers;  // CUDA: those of the bulk (async) ones (mappings.h)

  // group must be a communicator of ctx's device (or null). A side stream and a (lazily mapped) peer exchange
  // are made for CUDA groups of size > 1.
  static TensorParallel create(Context& ctx, std::shared_ptr<comm::Communicator> group, bool sequence_parallel);

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool enabled() const { return size() > 1; }
  bool sp() const { return sequence_parallel && enabled(); }

  // Rows this rank holds of a [rows, ...] activation of the sequence-parallel region, and the first one.
  int64_t sp_rows(int64_t rows) const { return sp() ? rows / size() : rows; }
  int64_t sp_row_offset(int64_t rows) const { return sp() ? int64_t(rank()) * (rows / size()) : 0; }
  // The pipelined collectives apply under sequence parallelism only.
  bool pipelined_ag() const { return sp() && comm_overlap.pipelined_ag; }
  bool pipelined_rs() const { return sp() && comm_overlap.pipelined_rs; }
};

}  // namespace megatron::parallel
