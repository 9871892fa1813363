#include "megatron/nn/moe_all_to_all.h"

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {

AllToAllPlan::AllToAllPlan(comm::Communicator& ep, const std::vector<int32_t>& my_counts, Timers* timers)
    : ep_(&ep), timers_(timers), size_(ep.size()), rank_(ep.rank()) {
  const int E = int(my_counts.size());
  MEGATRON_CHECK(E % size_ == 0, "alltoall dispatcher: ", E, " experts over ", size_, " expert-parallel ranks");
  num_local_ = E / size_;
  std::vector<double> all(size_t(size_) * size_t(E), 0.0);
  for (int e = 0; e < E; ++e) all[size_t(rank_) * size_t(E) + size_t(e)] = my_counts[size_t(e)];
  {
    TimerScope timer(timers_, "moe-tokens-per-expert", 2, TimerClock::Host);
    ep.all_reduce_host(all, comm::ReduceOp::Sum);
  }
  counts_.assign(size_t(size_), std::vector<int64_t>(size_t(E)));
  for (int i = 0; i < size_; ++i)
    for (int e = 0; e < E; ++e) counts_[size_t(i)][size_t(e)] = int64_t(all[size_t(i) * size_t(E) + size_t(e)]);
}

int64_t AllToAllPlan::send_rows() const {
  int64_t n = 0;
  for (int64_t c : counts_[size_t(rank_)]) n += c;
  return n;
}

int64_t AllToAllPlan::recv_rows() const {
  int64_t n = 0;
  for (int64_t c : local_counts()) n += c;
  return n;
}

std::vector<int64_t> AllToAllPlan::local_counts() const {
  std::vector<int64_t> out(size_t(num_local_), 0);
  for (int i = 0; i < size_; ++i)
    for (int e = 0; e < num_local_; ++e) out[size_t(e)] += counts_[size_t(i)][size_t(rank_ * num_local_ + e)];
  return out;
}

int64_t AllToAllPlan::received_offset(int i, int e) const {
  int64_t off = 0;
  for (int j = 0; j < i; ++j)
    for (int f = 0; f < num_local_; ++f) off += counts_[size_t(j)][size_t(rank_ * num_local_ + f)];
  for (int f = 0; f < e; ++f) off += counts_[size_t(i)][size_t(rank_ * num_local_ + f)];
  return off;
}

int64_t AllToAllPlan::grouped_offset(int i, int e) const {
  int64_t off = 0;
  for (int f = 0; f < e; ++f)
    for (int j = 0; j < size_; ++j) off += counts_[size_t(j)][size_t(rank_ * num_local_ + f)];
  for (int j = 0; j < i; ++j) off += counts_[size_t(j)][size_t(rank_ * num_local_ + e)];
  return off;
}

Tensor AllToAllPlan::dispatch(Context& ctx, const Tensor& x) const {
  const int64_t h = x.dim(1);
  std::vector<int64_t> send(size_t(size_), 0), recv(size_t(size_), 0);
  for (int j = 0; j < size_; ++j)
    for (int e = 0; e < num_local_; ++e) {
      send[size_t(j)] += counts_[size_t(rank_)][size_t(j * num_local_ + e)] * h;
      recv[size_t(j)] += counts_[size_t(j)][size_t(rank_ * num_local_ + e)] * h;
    }
  Tensor received = ctx.empty({recv_rows(), h}, x.dtype());
  {
    TimerScope timer(timers_, "moe-dispatch-all-to-all", 2);
    ep_->all_to_all(received, recv, x.slice(0, send_rows()), send, ctx.stream());
  }
  Tensor grouped = ctx.empty({recv_rows(), h}, x.dtype());
  for (int i = 0; i < size_; ++i)
    for (int e = 0; e < num_local_; ++e) {
      const int64_t n = counts_[size_t(i)][size_t(rank_ * num_local_ + e)], a = received_offset(i, e), b = grouped_offset(i, e);
      if (n > 0) ops::copy(ctx, grouped.slice(b, b + n), received.slice(a, a + n));
    }
  return grouped;
}

Tensor AllToAllPlan::combine(Context& ctx, const Tensor& y) const {
  const int64_t h = y.dim(1);
  Tensor received_order = ctx.empty({recv_rows(), h}, y.dtype());
  for (int i = 0; i < size_; ++i)
    for (int e = 0; e < num_local_; ++e) {
      const int64_t n = counts_[size_t(i)][size_t(rank_ * num_local_ + e)], a = received_offset(i, e), b = grouped_offset(i, e);
      if (n > 0) ops::copy(ctx, received_order.slice(a, a + n), y.slice(b, b + n));
    }
  std::vector<int64_t> send(size_t(size_), 0), recv(size_t(size_), 0);
  for (int j = 0; j < size_; ++j)
    for (int e = 0; e < num_local_; ++e) {
      send[size_t(j)] += counts_[size_t(j)][size_t(rank_ * num_local_ + e)] * h;
      recv[size_t(j)] += counts_[size_t(rank_)][size_t(j * num_local_ + e)] * h;
    }
  Tensor back = ctx.empty({send_rows(), h}, y.dtype());
  {
    TimerScope timer(timers_, "moe-combine-all-to-all", 2);
    ep_->all_to_all(back, recv, received_order, send, ctx.stream());
  }
  return back;
}

ExpertTpExchange::ExpertTpExchange(comm::Communicator& etp, const std::vector<int64_t>& my_counts)
    : etp_(&etp), size_(etp.size()), rank_(etp.rank()) {
  const size_t n = my_counts.size();
  std::vector<double> all(size_t(size_) * n, 0.0);
  for (size_t e = 0; e < n; ++e) all[size_t(rank_) * n + e] = double(my_counts[e]);
  etp.all_reduce_host(all, comm::ReduceOp::Sum);
  counts_.assign(size_t(size_), std::vector<int64_t>(n));
  for (int p = 0; p < size_; ++p)
    for (size_t e = 0; e < n; ++e) counts_[size_t(p)][e] = int64_t(all[size_t(p) * n + e]);
  for (int p = 0; p < size_; ++p) max_rows_ = std::max(max_rows_, peer_rows(p));
}

int64_t ExpertTpExchange::peer_rows(int p) const {
  int64_t r = 0;
  for (int64_t c : counts_[size_t(p)]) r += c;
  return r;
}

int64_t ExpertTpExchange::peer_offset(int p, int e) const {
  int64_t off = 0;
  for (int f = 0; f < e; ++f) off += counts_[size_t(p)][size_t(f)];
  return off;
}

int64_t ExpertTpExchange::grouped_offset(int p, int e) const {
  int64_t off = 0;
  for (int f = 0; f < e; ++f)
    for (int q = 0; q < size_; ++q) off += counts_[size_t(q)][size_t(f)];
  for (int q = 0; q < p; ++q) off += counts_[size_t(q)][size_t(e)];
  return off;
}

std::vector<int64_t> ExpertTpExchange::gathered_counts() const {
  std::vector<int64_t> out(counts_.front().size(), 0);
  for (const auto& peer : counts_)
    for (size_t e = 0; e < out.size(); ++e) out[e] += peer[e];
  return out;
}

Tensor ExpertTpExchange::gather(Context& ctx, const Tensor& rows) const {
  const int64_t h = rows.dim(1), E = int64_t(counts_.front().size());
  Tensor padded = ctx.empty({max_rows_, h}, rows.dtype()), all = ctx.empty({size_ * max_rows_, h}, rows.dtype());
  if (peer_rows(rank_) > 0) ops::copy(ctx, padded.slice(0, peer_rows(rank_)), rows.slice(0, peer_rows(rank_)));
  etp_->all_gather(all, padded, ctx.stream());
  int64_t total = 0;
  for (int64_t c : gathered_counts()) total += c;
  Tensor grouped = ctx.empty({total, h}, rows.dtype());
  for (int p = 0; p < size_; ++p)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = counts_[size_t(p)][size_t(e)], a = p * max_rows_ + peer_offset(p, int(e)), b = grouped_offset(p, int(e));
      if (n > 0) ops::copy(ctx, grouped.slice(b, b + n), all.slice(a, a + n));
    }
  return grouped;
}

Tensor ExpertTpExchange::reduce_scatter(Context& ctx, const Tensor& rows) const {
  const int64_t h = rows.dim(1), E = int64_t(counts_.front().size());
  Tensor all = ctx.empty({size_ * max_rows_, h}, rows.dtype()), mine = ctx.empty({max_rows_, h}, rows.dtype());
  ops::fill(ctx, all, 0.0);
  for (int p = 0; p < size_; ++p)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = counts_[size_t(p)][size_t(e)], a = p * max_rows_ + peer_offset(p, int(e)), b = grouped_offset(p, int(e));
      if (n > 0) ops::copy(ctx, all.slice(a, a + n), rows.slice(b, b + n));
    }
  etp_->reduce_scatter(mine, all, comm::ReduceOp::Sum, ctx.stream());
  return mine.slice(0, peer_rows(rank_));
}

}  // namespace megatron::nn
