#include "megatron/parallel/tp_comm_overlap.h"

#include <array>
#include <vector>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/tensor_parallel.h"

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

}  // namespace

Tensor row_block(const Tensor& t, int64_t cols, int64_t first, int64_t count) {
  return t.view({-1, cols}).slice(first, first + count);
}

void ring_all_gather(Context& ctx, const TensorParallel& tp, const Tensor& shard, const Tensor& gathered,
                     const std::function<void(int, const Tensor&)>& compute) {
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
    compute(c, current);
    if (gathered.defined()) ops::copy(ctx, row_block(gathered, cols, int64_t(c) * r, r), current);
    transfer.wait(ctx.stream());  // ctx's stream (CUDA) or the host (MPI) waits for the chunk to arrive
    current = next;
  }
  if (tp.overlap) tp.overlap->join(ctx);
}

void ring_reduce_scatter(Context& ctx, const TensorParallel& tp, const Tensor& out,
                         const std::function<void(int, const Tensor&)>& compute) {
  const int n = tp.size(), rank = tp.rank();
  std::vector<Tensor> in_flight;
  comm::PendingP2P transfer;
  Tensor incoming;
  for (int k = 0; k < n; ++k) {
    const int c = (rank + 2 * n - 1 - k) % n;  // k = n - 1: this rank's own chunk
    const Tensor partial = k + 1 == n ? out : ctx.empty(out.shape(), out.dtype());
    compute(c, partial);  // runs while the previous step's sum travels
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
