// The alltoall token dispatcher of an MoE layer (Megatron's MoEAlltoAllTokenDispatcher) for expert
// parallelism without expert tensor parallelism: each rank permutes its own tokens' slots by expert, sends
// every EP rank the rows of its experts (split sizes exchanged on the host: the grouped GEMM launches from
// host shapes anyway), regroups what it received by local expert, and after the experts sends every row
// back to the rank its token came from, in the order it left.
//
//   rows (this rank's slots, by expert) --all_to_all--> [from rank 0: e0 .. e_{n-1}][from rank 1: ...] ...
//        --regroup--> [e0: from rank 0, 1, ...][e1: ...] ... --experts--> and the way back.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/runtime/context.h"
#include "megatron/runtime/timers.h"

namespace megatron::nn {

// The sizes of one exchange, all on the host: counts[i][e] = rows rank i routes to expert e (every rank's).
class AllToAllPlan {
 public:
  // Collective over `ep` (host all-reduce of the counts). my_counts: this rank's rows per expert (all E).
  // timers (null: none): the exchanges under level-2 timers -- moe-tokens-per-expert (the counts' host
  // all-reduce), moe-dispatch-all-to-all and moe-combine-all-to-all (each exchange, forward and backward, from
  // its launch until the compute stream may go on: a rank that waits for a slower peer's tokens waits here).
  AllToAllPlan(comm::Communicator& ep, const std::vector<int32_t>& my_counts, Timers* timers = nullptr);

  int64_t send_rows() const;                 // rows this rank sends (= its kept slots)
  int64_t recv_rows() const;                 // rows its experts receive
  std::vector<int64_t> local_counts() const;  // rows per local expert, from every rank together

  // x [send_rows, h] (this rank's rows by expert) -> [recv_rows, h] grouped by local expert.
  Tensor dispatch(Context& ctx, const Tensor& x) const;
  // The inverse: y [recv_rows, h] by local expert -> [send_rows, h] in this rank's order.
  Tensor combine(Context& ctx, const Tensor& y) const;

 private:
  // Block (source rank i, local expert e) of the received layout and of the grouped layout.
  int64_t received_offset(int i, int e) const;
  int64_t grouped_offset(int i, int e) const;

  comm::Communicator* ep_ = nullptr;
  Timers* timers_ = nullptr;
  int size_ = 1, rank_ = 0, num_local_ = 0;
  std::vector<std::vector<int64_t>> counts_;  // [rank][expert]
};

// Expert tensor parallelism after the alltoall exchange: the expert-TP ranks hold shards of the same experts
// but received different tokens. Each gathers every peer's rows (Megatron's all-gather over the expert-TP
// group), runs its shard on all of them, and the partial outputs are summed back onto the rows' owners
// (reduce-scatter). Row counts differ between peers, so the exchange pads every peer's block to the largest.
//   rows [my_rows, h] grouped by local expert --gather--> [sum, h] grouped by local expert (peers in rank
//   order within each expert) --experts--> --reduce_scatter--> [my_rows, h] summed over the peers' shards.
// gather's adjoint is reduce_scatter and the other way round, which is how the backward uses them.
class ExpertTpExchange {
 public:
  // Collective over `etp` (host all-reduce of the counts). my_counts: this rank's rows per local expert.
  ExpertTpExchange(comm::Communicator& etp, const std::vector<int64_t>& my_counts);

  std::vector<int64_t> gathered_counts() const;  // rows per local expert over every peer
  Tensor gather(Context& ctx, const Tensor& rows) const;
  Tensor reduce_scatter(Context& ctx, const Tensor& rows) const;

 private:
  int64_t peer_rows(int p) const;
  int64_t peer_offset(int p, int e) const;     // expert e's block inside peer p's rows
  int64_t grouped_offset(int p, int e) const;  // the block's place in the gathered, expert-major layout

  comm::Communicator* etp_ = nullptr;
  int size_ = 1, rank_ = 0;
  int64_t max_rows_ = 0;
  std::vector<std::vector<int64_t>> counts_;  // [peer][local expert]
};

}  // namespace megatron::nn
