// The paired collectives tensor and sequence parallelism are built from (Megatron's
// megatron/core/tensor_parallel/mappings.py), each as an explicit forward and backward over the TP group
// of a TensorParallel:
//
//   region                 forward                               backward
//   copy_to_tp             identity                              all-reduce (sum) of the input gradient
//   reduce_from_tp         all-reduce (sum)                      identity
//   scatter_to_tp          this rank's block of the last dim     all-gather along the last dim
//   gather_from_tp         all-gather along the last dim         this rank's block of the last dim
//   gather_from_sp         all-gather of rows (tokens)           reduce-scatter (sum) of rows
//   reduce_scatter_to_sp   reduce-scatter (sum) of rows          all-gather of rows
//
// Identity halves need no function. Shapes: the last-dim pairs take [..., n / TP] <-> [..., n] (rank r holds
// columns [r * n / TP, (r + 1) * n / TP)); the sequence-parallel pairs take [T / TP, ...] <-> [T, ...] (rank r
// holds rows [r * T / TP, (r + 1) * T / TP), see tensor_parallel.h). Outputs are assigned; all-reduces work
// in place. Every rank of the group calls the same functions in the same order (communicator.h). A group
// of one (TP = 1) does nothing: no collective is called and in-place forms do not touch the tensor;
// out-of-place forms copy (TP = 1 modules do not call them).
//
// Overlap (CUDA): functions returning a PendingCollective take `async`. With async and a side stream in `tp`, the
// collective is queued on the side stream behind the work already on ctx's stream, so work queued on ctx's stream
// next (the weight-gradient GEMM) runs concurrently; PendingCollective::wait(ctx) makes ctx's stream wait for it
// (nothing blocks the host). Without async, or on CPU ranks (MPI completes inside the call), the collective is
// ordered on ctx's stream and wait() does nothing. The PendingCollective holds the tensors the side stream reads or
// writes until wait() (stream_fork.h's rule), so a caller may drop its own handles earlier: memory freed to the
// caching allocator while the side stream still used it would go to the next allocation on ctx's stream and be
// overwritten under the collective. With --tp-comm-overlap's copy-engine transport (tp_comm_overlap.h) the async
// sequence-parallel gather and reduce-scatter push this rank's rows into the peers' staging slots instead
// (tp.bulk_peers, a PeerExchange of their own, so they never queue behind the pipelined collectives that run between
// their issue and their wait), and wait() copies or adds the peers' rows in, in the fixed order rank - 1, rank - 2,
// ...
#pragma once

#include <functional>
#include <vector>

#include "megatron/parallel/tensor_parallel.h"

namespace megatron::parallel {

class PendingCollective {
 public:
  PendingCollective() = default;
  // A collective queued on `fork`'s side stream (null: on ctx's stream, nothing pending) over `in_use`.
  PendingCollective(StreamFork* fork, std::vector<Tensor> in_use)
      : fork_(fork), in_use_(fork != nullptr ? std::move(in_use) : std::vector<Tensor>{}) {}
  // A collective whose last part is queued on ctx's stream at wait() by finish(ctx) (the copy-engine forms:
  // the peers' rows copied or added in as they land; finish holds the tensors it reads).
  PendingCollective(StreamFork* fork, std::function<void(Context&)> finish)
      : fork_(fork), finish_(std::move(finish)) {}
  // ctx's stream waits for the collective, then the tensors are released; idempotent.
  void wait(Context& ctx);

 private:
  StreamFork* fork_ = nullptr;
  std::function<void(Context&)> finish_;
  std::vector<Tensor> in_use_;  // alive until the join: the side stream reads or writes them
};

// copy_to_tp backward: dx = sum over the TP ranks of dx (in place).
PendingCollective copy_to_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, bool async = false);

// reduce_from_tp forward: y = sum over the TP ranks of y (in place).
void reduce_from_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& y);

// scatter_to_tp forward: out [..., n / TP] = this rank's columns of x [..., n]; backward: dx [..., n] =
// every rank's dout [..., n / TP] side by side.
void scatter_to_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x);
void scatter_to_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, const Tensor& dout);

// gather_from_tp forward: out [..., n] = every rank's x [..., n / TP] side by side; backward: dx [..., n / TP]
// = this rank's columns of dout [..., n].
void gather_from_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x);
void gather_from_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, const Tensor& dout);

// gather_from_sp forward: out [T, ...] = every rank's x [T / TP, ...] stacked in rank order; backward:
// dx [T / TP, ...] = this rank's rows of the sum over the ranks of dout [T, ...].
PendingCollective gather_from_sp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x,
                                         bool async = false);
PendingCollective gather_from_sp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx,
                                          const Tensor& dout, bool async = false);

// reduce_scatter_to_sp forward: out [T / TP, ...] = this rank's rows of the sum over the ranks of x [T, ...];
// backward: dx [T, ...] = every rank's dout [T / TP, ...] stacked in rank order.
void reduce_scatter_to_sp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x);
PendingCollective reduce_scatter_to_sp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx,
                                                const Tensor& dout, bool async = false);

}  // namespace megatron::parallel
