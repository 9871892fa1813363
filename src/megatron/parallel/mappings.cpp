#include "megatron/parallel/mappings.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/runtime/timeline.h"

namespace megatron::parallel {
namespace {

// The stream a collective is issued on: the side stream (after forking from ctx's) when overlapping.
struct Issue {
  StreamHandle stream;
  StreamFork* fork;
};
Issue issue(Context& ctx, const TensorParallel& tp, bool async) {
  if (async && tp.overlap) return {tp.overlap->fork(ctx), tp.overlap.get()};
  return {ctx.stream(), nullptr};
}

std::string where(const TensorParallel& tp) {
  return tp.group ? tp.group->describe() : std::string("no tensor-parallel group");
}

void check_same_dtype(const char* op, const TensorParallel& tp, const Tensor& a, const Tensor& b) {
  MEGATRON_CHECK(a.defined() && b.defined() && a.dtype() == b.dtype() && a.device() == b.device(), op, " on ",
                 where(tp), ": ", a.describe(), " and ", b.describe(), " must be defined, of one dtype and device");
}

// big [R, n * TP] against small [R, n] (any leading shape, same rows).
void check_last_dim(const char* op, const TensorParallel& tp, const Tensor& big, const Tensor& small) {
  check_same_dtype(op, tp, big, small);
  MEGATRON_CHECK(big.rank() >= 1 && small.rank() >= 1 && big.shape().rows() == small.shape().rows() &&
                     big.shape().cols() == small.shape().cols() * tp.size(),
                 op, " on ", where(tp), ": ", big.describe(), " must have the rows of ", small.describe(), " and ",
                 tp.size(), " times its last dimension");
}

// big [T, ...] against small [T / TP, ...] (same trailing elements per row).
void check_rows(const char* op, const TensorParallel& tp, const Tensor& big, const Tensor& small) {
  check_same_dtype(op, tp, big, small);
  MEGATRON_CHECK(big.rank() >= 1 && small.rank() >= 1 && big.numel() == small.numel() * tp.size() &&
                     big.dim(0) == small.dim(0) * tp.size(),
                 op, " on ", where(tp), ": ", big.describe(), " must stack ", tp.size(), " shards of ",
                 small.describe(), " along dimension 0");
}

void copy_if_distinct(Context& ctx, const Tensor& out, const Tensor& in) {
  if (out.data_ptr() != in.data_ptr()) ops::copy(ctx, out, in);
}

// out [R, n * TP] = the ranks' x [R, n] side by side: all-gather of the transposes, transposed back.
void all_gather_last_dim(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x) {
  const int64_t rows = x.shape().rows(), n = x.shape().cols();
  Tensor xt = ctx.empty({n, rows}, x.dtype());
  ops::transpose(ctx, xt, x.view({rows, n}));
  Tensor gathered = ctx.empty({n * tp.size(), rows}, x.dtype());
  tp.group->all_gather(gathered, xt, ctx.stream());
  ops::transpose(ctx, out.view({rows, n * tp.size()}), gathered);
}

// out [R, n] = this rank's columns of x [R, n * TP].
void split_last_dim(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x) {
  const int64_t rows = out.shape().rows(), n = out.shape().cols(), r = tp.rank();
  Tensor xt = ctx.empty({n * tp.size(), rows}, x.dtype());
  ops::transpose(ctx, xt, x.view({rows, n * tp.size()}));
  ops::transpose(ctx, out.view({rows, n}), xt.slice(r * n, (r + 1) * n));
}

// The copy-engine exchange for the bulk (async) sequence-parallel collectives of `bytes` per rank, or null.
std::shared_ptr<PeerExchange> bulk_exchange(Context& ctx, const TensorParallel& tp, bool async, int64_t bytes) {
  if (!async || !ctx.is_cuda() || !tp.overlap || !tp.bulk_peers || !tp.comm_overlap.copy_engine) return nullptr;
  return tp.bulk_peers->get(ctx, *tp.group, bytes);
}

// out [P r, ...] = every rank's x [r, ...]: x pushed to every peer now (side stream), the peers' rows copied in
// at wait().
PendingCollective exchange_gather_rows(Context& ctx, const TensorParallel& tp, std::shared_ptr<PeerExchange> px,
                                       const Tensor& out, const Tensor& x) {
  const int n = tp.size(), me = tp.rank();
  const int64_t r = x.dim(0), cols = x.numel() / r;
  const StreamHandle side = tp.overlap->fork(ctx);
  {
    TimelineScope span(ctx.timeline(), "bulk all-gather push", "tp-comm", side);
    for (int k = 1; k < n; ++k) px->push(side, x, (me + k) % n);
  }
  ops::copy(ctx, out.view({-1, cols}).slice(me * r, (me + 1) * r), x.view({r, cols}));
  return PendingCollective(tp.overlap.get(), [px, out, x, n, me, r, cols](Context& c) {
    for (int k = 1; k < n; ++k) {
      const int src = (me + n - k) % n;
      px->wait_arrival(c.stream(), src);
      ops::copy(c, out.view({-1, cols}).slice(src * r, (src + 1) * r), px->slot(src, {r, cols}, x.dtype()));
      px->release(c.stream(), src);
    }
  });
}

// dx [r, ...] = the sum over the ranks of their dout [P r, ...]'s rows of this rank: each other chunk pushed to
// its owner now (side stream), this rank's rows copied and the peers' added at wait().
PendingCollective exchange_reduce_scatter_rows(Context& ctx, const TensorParallel& tp, std::shared_ptr<PeerExchange> px,
                                               const Tensor& dx, const Tensor& dout) {
  const int n = tp.size(), me = tp.rank();
  const int64_t r = dx.dim(0), cols = dx.numel() / r;
  const Tensor rows = dout.view({-1, cols});
  const StreamHandle side = tp.overlap->fork(ctx);
  {
    TimelineScope span(ctx.timeline(), "bulk reduce-scatter push", "tp-comm", side);
    for (int k = 1; k < n; ++k) {
      const int c = (me + k) % n;
      px->push(side, rows.slice(c * r, (c + 1) * r), c);
    }
  }
  return PendingCollective(tp.overlap.get(), [px, dx, rows, n, me, r, cols](Context& c) {
    const Tensor sum = dx.view({r, cols});
    ops::copy(c, sum, rows.slice(me * r, (me + 1) * r));
    for (int k = 1; k < n; ++k) {
      const int src = (me + n - k) % n;
      px->wait_arrival(c.stream(), src);
      ops::add(c, sum, sum, px->slot(src, {r, cols}, dx.dtype()));
      px->release(c.stream(), src);
    }
  });
}

}  // namespace

void PendingCollective::wait(Context& ctx) {
  // `finish` holds the tensors this rank pushes on the side stream; it lives to the end, past the join, as the
  // NCCL forms' in_use_ does: the pushes may still be reading them when finish has queued its copies.
  const std::function<void(Context&)> finish = std::move(finish_);
  finish_ = nullptr;
  if (finish) finish(ctx);
  if (fork_ != nullptr) fork_->join(ctx);
  fork_ = nullptr;
  in_use_.clear();  // after the join: work queued from here on follows the collective
}

PendingCollective copy_to_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, bool async) {
  if (!tp.enabled()) return {};
  Issue i = issue(ctx, tp, async);
  tp.group->all_reduce(dx, comm::ReduceOp::Sum, i.stream);
  return PendingCollective(i.fork, {dx});
}

void reduce_from_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& y) {
  if (!tp.enabled()) return;
  tp.group->all_reduce(y, comm::ReduceOp::Sum, ctx.stream());
}

void scatter_to_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x) {
  check_last_dim("scatter_to_tp_forward", tp, x, out);
  if (!tp.enabled()) return copy_if_distinct(ctx, out, x);
  split_last_dim(ctx, tp, out, x);
}

void scatter_to_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, const Tensor& dout) {
  check_last_dim("scatter_to_tp_backward", tp, dx, dout);
  if (!tp.enabled()) return copy_if_distinct(ctx, dx, dout);
  all_gather_last_dim(ctx, tp, dx, dout);
}

void gather_from_tp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x) {
  check_last_dim("gather_from_tp_forward", tp, out, x);
  if (!tp.enabled()) return copy_if_distinct(ctx, out, x);
  all_gather_last_dim(ctx, tp, out, x);
}

void gather_from_tp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx, const Tensor& dout) {
  check_last_dim("gather_from_tp_backward", tp, dout, dx);
  if (!tp.enabled()) return copy_if_distinct(ctx, dx, dout);
  split_last_dim(ctx, tp, dx, dout);
}

PendingCollective gather_from_sp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x,
                                         bool async) {
  check_rows("gather_from_sp_forward", tp, out, x);
  if (!tp.enabled()) {
    copy_if_distinct(ctx, out, x);
    return {};
  }
  if (auto px = bulk_exchange(ctx, tp, async, int64_t(x.nbytes()))) return exchange_gather_rows(ctx, tp, px, out, x);
  Issue i = issue(ctx, tp, async);
  tp.group->all_gather(out, x, i.stream);
  return PendingCollective(i.fork, {out, x});
}

PendingCollective gather_from_sp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx,
                                          const Tensor& dout, bool async) {
  check_rows("gather_from_sp_backward", tp, dout, dx);
  if (!tp.enabled()) {
    copy_if_distinct(ctx, dx, dout);
    return {};
  }
  if (auto px = bulk_exchange(ctx, tp, async, int64_t(dx.nbytes())))
    return exchange_reduce_scatter_rows(ctx, tp, px, dx, dout);
  Issue i = issue(ctx, tp, async);
  tp.group->reduce_scatter(dx, dout, comm::ReduceOp::Sum, i.stream);
  return PendingCollective(i.fork, {dx, dout});
}

void reduce_scatter_to_sp_forward(Context& ctx, const TensorParallel& tp, const Tensor& out, const Tensor& x) {
  check_rows("reduce_scatter_to_sp_forward", tp, x, out);
  if (!tp.enabled()) return copy_if_distinct(ctx, out, x);
  tp.group->reduce_scatter(out, x, comm::ReduceOp::Sum, ctx.stream());
}

PendingCollective reduce_scatter_to_sp_backward(Context& ctx, const TensorParallel& tp, const Tensor& dx,
                                                const Tensor& dout, bool async) {
  check_rows("reduce_scatter_to_sp_backward", tp, dx, dout);
  if (!tp.enabled()) {
    copy_if_distinct(ctx, dx, dout);
    return {};
  }
  Issue i = issue(ctx, tp, async);
  tp.group->all_gather(dx, dout, i.stream);
  return PendingCollective(i.fork, {dx, dout});
}

}  // namespace megatron::parallel
