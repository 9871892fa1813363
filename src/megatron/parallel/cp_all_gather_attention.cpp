#include "megatron/parallel/cp_all_gather_attention.h"

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/sequence_rows.h"

namespace megatron::parallel {
namespace {

void check_shapes(const Tensor& q, const Tensor& k, const ops::AttentionOptions& options) {
  MEGATRON_CHECK(options.causal, "all-gather context-parallel attention computes causal attention");
  MEGATRON_CHECK(q.rank() == 4 && k.rank() == 4 && q.dim(1) == k.dim(1) && q.dim(1) % 2 == 0, "all-gather attention: q ",
                 q.describe(), " and k ", k.describe(), " must hold the same even number of tokens (two chunks)");
}

}  // namespace

int64_t chunk_of(int rank, int half, int P) { return half == 0 ? rank : 2 * P - 1 - rank; }

Tensor gather_sequence(Context& ctx, comm::Communicator& group, const Tensor& x) {
  const int P = group.size();
  const int64_t c = x.dim(1) / 2;
  Tensor gathered = ctx.empty({P, x.dim(0), x.dim(1), x.dim(2), x.dim(3)}, x.dtype());
  group.all_gather(gathered, x, ctx.stream());
  Tensor whole = ctx.empty({x.dim(0), int64_t(P) * x.dim(1), x.dim(2), x.dim(3)}, x.dtype());
  for (int j = 0; j < P; ++j)
    for (int half = 0; half < 2; ++half)
      ops::copy_slices(ctx, whole, chunk_of(j, half, P) * c, gathered.select(j), half * c, c, kSeqDim);
  return whole;
}

void reduce_scatter_sequence(Context& ctx, comm::Communicator& group, const Tensor& out, const Tensor& whole) {
  const int P = group.size();
  const int64_t c = out.dim(1) / 2;
  Tensor by_rank = ctx.empty({P, out.dim(0), out.dim(1), out.dim(2), out.dim(3)}, out.dtype());
  for (int j = 0; j < P; ++j)
    for (int half = 0; half < 2; ++half)
      ops::copy_slices(ctx, by_rank.select(j), half * c, whole, chunk_of(j, half, P) * c, c, kSeqDim);
  group.reduce_scatter(out, by_rank, comm::ReduceOp::Sum, ctx.stream());
}

namespace {

// The options of query half `half`'s call: its queries at their chunk's positions, the keys (the whole
// sequence's prefix, in natural order) at their own.
ops::AttentionOptions half_options(const ops::AttentionOptions& options, int rank, int half, int P, int64_t c) {
  if (!options.dropout.enabled()) return options;
  ops::AttentionOptions o = options;
  o.dropout.queries = {{0, chunk_of(rank, half, P) * c, c}};
  o.dropout.keys.clear();
  return o;
}

}  // namespace

void all_gather_attention_forward(Context& ctx, comm::Communicator& group, const Tensor& out, const Tensor& stats,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionOptions& options) {
  check_shapes(q, k, options);
  const int P = group.size(), r = group.rank();
  const int64_t c = q.dim(1) / 2;
  const Tensor k_all = gather_sequence(ctx, group, k), v_all = gather_sequence(ctx, group, v);
  for (int half = 0; half < 2; ++half) {
    const int64_t visible = (chunk_of(r, half, P) + 1) * c;
    const WriteRows o(ctx, out, half * c, c), s(ctx, stats, half * c, c, kStatsSeqDim);
    ops::attention_forward(ctx, o.tensor(), s.tensor(), read_rows(ctx, q, half * c, c), read_rows(ctx, k_all, 0, visible),
                           read_rows(ctx, v_all, 0, visible), half_options(options, r, half, P, c));
    o.commit(ctx);
    s.commit(ctx);
  }
}

void all_gather_attention_backward(Context& ctx, comm::Communicator& group, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& stats,
                                   const ops::AttentionOptions& options) {
  check_shapes(q, k, options);
  const int P = group.size(), r = group.rank();
  const int64_t c = q.dim(1) / 2;
  const Tensor k_all = gather_sequence(ctx, group, k), v_all = gather_sequence(ctx, group, v);
  Tensor dk_all = ctx.empty(k_all.shape(), k.dtype()), dv_all = ctx.empty(v_all.shape(), v.dtype());
  ops::fill(ctx, dk_all, 0.0);
  ops::fill(ctx, dv_all, 0.0);
  for (int half = 0; half < 2; ++half) {
    const int64_t visible = (chunk_of(r, half, P) + 1) * c;
    const WriteRows dq_rows(ctx, dq, half * c, c);
    Tensor dk_part = ctx.empty(with_extent(k.shape(), kSeqDim, visible), k.dtype());
    Tensor dv_part = ctx.empty(with_extent(v.shape(), kSeqDim, visible), v.dtype());
    ops::attention_backward(ctx, dq_rows.tensor(), dk_part, dv_part, read_rows(ctx, dout, half * c, c),
                            read_rows(ctx, q, half * c, c), read_rows(ctx, k_all, 0, visible),
                            read_rows(ctx, v_all, 0, visible), read_rows(ctx, out, half * c, c),
                            read_rows(ctx, stats, half * c, c, kStatsSeqDim), half_options(options, r, half, P, c));
    dq_rows.commit(ctx);
    add_rows(ctx, dk_all, 0, dk_part);
    add_rows(ctx, dv_all, 0, dv_part);
  }
  reduce_scatter_sequence(ctx, group, dk, dk_all);
  reduce_scatter_sequence(ctx, group, dv, dv_all);
}

}  // namespace megatron::parallel
