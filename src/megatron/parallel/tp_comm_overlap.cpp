#include "megatron/parallel/tp_comm_overlap.h"

#include <array>
#include <vector>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/tensor_parallel.h"
#include "megatron/runtime/timeline.h"

namespace megatron::parallel {

namespace {

// One ring step's transfer: send `out_chunk` to rank + 1 and receive into `in_chunk` from rank - 1, on the
// group's side stream after ctx's work so far (CUDA) or as nonblocking MPI requests (CPU).
comm::PendingP2P ring_step(Context& ctx, const TensorParallel& tp, const Tensor& out_chunk, const Tensor& in_chunk) {
  const int n = tp.size(), rank = tp.rank();
  const StreamHandle side = tp.overlap ? tp.overlap->fork(ctx) : nullptr;
  const std::array<comm::P2POp, 2> ops = {comm::P2POp::send(out_chunk, (rank + 1) % n),
                                          comm::P2POp::recv(in_chunk, (rank + n - 1) % n)};
  return tp.group->batch_send_recv(ops, side);
}

// The group's copy-engine exchange with slots of at least `bytes`, or null (CPU, NCCL asked, or unmappable).
std::shared_ptr<PeerExchange> peer_exchange(Context& ctx, const TensorParallel& tp, int64_t bytes) {
  if (!ctx.is_cuda() || !tp.peers || !tp.overlap || !tp.comm_overlap.copy_engine) return nullptr;
  return tp.peers->get(ctx, *tp.group, bytes);
}

// All-gather by pushes: this rank's shard goes to every peer's slot on the side stream at once, while ctx's
// stream computes on it; then each peer's shard, in the ring's order (rank - 1, rank - 2, ...), as it lands.
void exchange_all_gather(Context& ctx, const TensorParallel& tp, PeerExchange& px, const Tensor& shard,
                         const Tensor& gathered, const std::function<void(int, const Tensor&)>& compute) {
  const int n = tp.size(), rank = tp.rank();
  const int64_t r = shard.dim(0), cols = shard.shape().cols();
  const StreamHandle side = tp.overlap->fork(ctx);
  {
    TimelineScope span(ctx.timeline(), "all-gather push", "tp-comm", side);
    for (int k = 1; k < n; ++k) px.push(side, shard, (rank + k) % n);
  }
  {
    TimelineScope span(ctx.timeline(), "all-gather GEMM (own rows)", "tp-gemm");
    compute(rank, shard);
  }
  if (gathered.defined()) ops::copy(ctx, row_block(gathered, cols, int64_t(rank) * r, r), shard);
  for (int k = 1; k < n; ++k) {
    const int c = (rank + n - k) % n;
    px.wait_arrival(ctx.stream(), c);
    const Tensor rows = px.slot(c, shard.shape(), shard.dtype());
    TimelineScope span(ctx.timeline(), "all-gather GEMM (peer's rows)", "tp-gemm");
    compute(c, rows);
    if (gathered.defined()) ops::copy(ctx, row_block(gathered, cols, int64_t(c) * r, r), rows);
    px.release(ctx.stream(), c);  // after the work that reads the slot
  }
  tp.overlap->join(ctx);  // the pushes have read `shard` before anything queued later may reuse its memory
}

// Reduce-scatter by pushes: this rank computes its partial for every other chunk first (chunk rank + 1 first,
// the order in which its owner will add it) and pushes each to the chunk's owner as soon as it is computed, then
// its own chunk into `out`, then adds the partials pushed to it in the fixed order rank - 1, rank - 2, ...
void exchange_reduce_scatter(Context& ctx, const TensorParallel& tp, PeerExchange& px, const Tensor& out,
                             const std::function<void(int, const Tensor&)>& compute) {
  const int n = tp.size(), rank = tp.rank();
  std::vector<Tensor> in_flight;  // the pushed partials, alive until the side stream is joined
  for (int k = 1; k < n; ++k) {
    const int c = (rank + k) % n;
    const Tensor partial = ctx.empty(out.shape(), out.dtype());
    {
      TimelineScope span(ctx.timeline(), "reduce-scatter GEMM (peer's rows)", "tp-gemm");
      compute(c, partial);
    }
    const StreamHandle side = tp.overlap->fork(ctx);
    TimelineScope span(ctx.timeline(), "reduce-scatter push", "tp-comm", side);
    px.push(side, partial, c);
    in_flight.push_back(partial);
  }
  {
    TimelineScope span(ctx.timeline(), "reduce-scatter GEMM (own rows)", "tp-gemm");
    compute(rank, out);
  }
  for (int k = 1; k < n; ++k) {
    const int src = (rank + n - k) % n;
    px.wait_arrival(ctx.stream(), src);
    TimelineScope span(ctx.timeline(), "reduce-scatter add", "tp-gemm");
    ops::add(ctx, out, out, px.slot(src, out.shape(), out.dtype()));
    px.release(ctx.stream(), src);
  }
  tp.overlap->join(ctx);
}

}  // namespace

Tensor row_block(const Tensor& t, int64_t cols, int64_t first, int64_t count) {
  return t.view({-1, cols}).slice(first, first + count);
}

void ring_all_gather(Context& ctx, const TensorParallel& tp, const Tensor& shard, const Tensor& gathered,
                     const std::function<void(int, const Tensor&)>& compute) {
  if (const std::shared_ptr<PeerExchange> px = peer_exchange(ctx, tp, int64_t(shard.nbytes()))) {
    exchange_all_gather(ctx, tp, *px, shard, gathered, compute);
    return;
  }
  const int n = tp.size(), rank = tp.rank();
  const int64_t r = shard.dim(0), cols = shard.shape().cols();
  std::vector<Tensor> in_flight;  // every chunk a transfer touched, alive until the side stream is joined
  Tensor current = shard;
  for (int k = 0; k < n; ++k) {
    const int c = (rank + n - k) % n;
    comm::PendingP2P transfer;
    Tensor next;
    if (k + 1 < n) {
      next = ctx.empty(shard.shape(), shard.dtype());
      transfer = ring_step(ctx, tp, current, next);
      in_flight.push_back(current);
      in_flight.push_back(next);
    }
    {
      TimelineScope span(ctx.timeline(), "all-gather GEMM (ring chunk)", "tp-gemm");
      compute(c, current);
    }
    if (gathered.defined()) ops::copy(ctx, row_block(gathered, cols, int64_t(c) * r, r), current);
    transfer.wait(ctx.stream());  // ctx's stream (CUDA) or the host (MPI) waits for the chunk to arrive
    current = next;
  }
  if (tp.overlap) tp.overlap->join(ctx);
}

void ring_reduce_scatter(Context& ctx, const TensorParallel& tp, const Tensor& out,
                         const std::function<void(int, const Tensor&)>& compute) {
  if (const std::shared_ptr<PeerExchange> px = peer_exchange(ctx, tp, int64_t(out.nbytes()))) {
    exchange_reduce_scatter(ctx, tp, *px, out, compute);
    return;
  }
  const int n = tp.size(), rank = tp.rank();
  std::vector<Tensor> in_flight;
  comm::PendingP2P transfer;
  Tensor incoming;
  for (int k = 0; k < n; ++k) {
    const int c = (rank + 2 * n - 1 - k) % n;  // k = n - 1: this rank's own chunk
    const Tensor partial = k + 1 == n ? out : ctx.empty(out.shape(), out.dtype());
    {
      TimelineScope span(ctx.timeline(), "reduce-scatter GEMM (ring chunk)", "tp-gemm");
      compute(c, partial);  // runs while the previous step's sum travels
    }
    if (k > 0) {
      transfer.wait(ctx.stream());
      ops::add(ctx, partial, partial, incoming);
    }
    if (k + 1 < n) {
      incoming = ctx.empty(out.shape(), out.dtype());
      transfer = ring_step(ctx, tp, partial, incoming);
      in_flight.push_back(partial);
      in_flight.push_back(incoming);
    }
  }
  if (tp.overlap) tp.overlap->join(ctx);
}

}  // namespace megatron::parallel
