#include "megatron/parallel/cp_attention.h"

#include "megatron/parallel/cp_all_gather_attention.h"
#include "megatron/parallel/cp_all_to_all.h"
#include "megatron/parallel/ring_attention.h"

namespace megatron::parallel {
namespace {

// The all-to-all level and the ring level of the a2a types (the ring may be absent: plain attention).
struct A2aLevels {
  comm::Communicator* a2a = nullptr;
  comm::Communicator* ring = nullptr;
};

A2aLevels a2a_levels(const ContextParallel& cp, CpCommType type) {
  if (type == CpCommType::A2A) return {cp.group.get(), nullptr};
  MEGATRON_CHECK(cp.a2a_group && cp.p2p_group, "context parallelism a2a+p2p needs the hierarchical groups ",
                 "(--hierarchical-context-parallel-sizes)");
  return {cp.a2a_group.get(), cp.p2p_group.get()};
}

Tensor stats_for(Context& ctx, const Tensor& q) { return ctx.empty({q.dim(0), q.dim(2), q.dim(1), 1}, DType::F32); }

// Dropout's defaults made explicit before any layout changes the call's shape: P's heads are this rank's
// (q's) and its sequence is the whole one, CP x the local tokens.
ops::AttentionOptions whole_addressing(const ops::AttentionOptions& options, const ContextParallel& cp,
                                       const Tensor& q) {
  ops::AttentionOptions o = options;
  if (o.dropout.heads == 0) o.dropout.heads = q.dim(2);
  if (o.dropout.seq == 0) o.dropout.seq = q.dim(1) * cp.size();
  return o;
}

// After the all-to-all over heads this rank holds head group a2a.rank() of its heads: dropout addresses them
// there.
ops::AttentionOptions heads_options(const ops::AttentionOptions& options, const comm::Communicator& a2a,
                                    int64_t local_heads) {
  ops::AttentionOptions o = options;
  o.dropout.head_offset += int64_t(a2a.rank()) * (local_heads / a2a.size());
  return o;
}

}  // namespace

CpAttentionSaved cp_attention_forward(Context& ctx, const ContextParallel& cp, CpCommType type, const Tensor& out,
                                      const Tensor& q, const Tensor& k, const Tensor& v,
                                      const ops::AttentionOptions& given) {
  const ops::AttentionOptions options = whole_addressing(given, cp, q);
  switch (type) {
    case CpCommType::P2P: {
      CpAttentionSaved s{q, k, v, out, stats_for(ctx, q)};
      ring_attention_forward(ctx, cp.group.get(), out, s.stats, q, k, v, options, cp.ring_peers.get());
      return s;
    }
    case CpCommType::AllGather: {
      CpAttentionSaved s{q, k, v, out, stats_for(ctx, q)};
      all_gather_attention_forward(ctx, *cp.group, out, s.stats, q, k, v, options);
      return s;
    }
    case CpCommType::A2A:
    case CpCommType::A2AP2P: {
      const A2aLevels levels = a2a_levels(cp, type);
      CpAttentionSaved s{scatter_heads(ctx, *levels.a2a, q), scatter_heads(ctx, *levels.a2a, k),
                         scatter_heads(ctx, *levels.a2a, v)};
      s.out = ctx.empty(s.q.shape(), s.q.dtype());
      s.stats = stats_for(ctx, s.q);
      ring_attention_forward(ctx, levels.ring, s.out, s.stats, s.q, s.k, s.v, heads_options(options, *levels.a2a, q.dim(2)));
      gather_heads(ctx, *levels.a2a, out, s.out);
      return s;
    }
  }
  MEGATRON_FAIL("cp_attention_forward: unknown communication type");
}

void cp_attention_backward(Context& ctx, const ContextParallel& cp, CpCommType type, CpAttentionSaved&& saved,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                           const ops::AttentionOptions& given) {
  const ops::AttentionOptions options = whole_addressing(given, cp, dq);
  CpAttentionSaved s = std::move(saved);
  switch (type) {
    case CpCommType::P2P:
      ring_attention_backward(ctx, cp.group.get(), dq, dk, dv, dout, s.q, s.k, s.v, s.out, s.stats, options,
                              cp.ring_peers.get());
      return;
    case CpCommType::AllGather:
      all_gather_attention_backward(ctx, *cp.group, dq, dk, dv, dout, s.q, s.k, s.v, s.out, s.stats, options);
      return;
    case CpCommType::A2A:
    case CpCommType::A2AP2P: {
      const A2aLevels levels = a2a_levels(cp, type);
      const Tensor dout_heads = scatter_heads(ctx, *levels.a2a, dout);
      Tensor dq_heads = ctx.empty(s.q.shape(), s.q.dtype()), dk_heads = ctx.empty(s.k.shape(), s.k.dtype()),
             dv_heads = ctx.empty(s.v.shape(), s.v.dtype());
      ring_attention_backward(ctx, levels.ring, dq_heads, dk_heads, dv_heads, dout_heads, s.q, s.k, s.v, s.out,
                              s.stats, heads_options(options, *levels.a2a, dout.dim(2)));
      s = CpAttentionSaved{};  // the core's tensors are no longer needed
      gather_heads(ctx, *levels.a2a, dq, dq_heads);
      gather_heads(ctx, *levels.a2a, dk, dk_heads);
      gather_heads(ctx, *levels.a2a, dv, dv_heads);
      return;
    }
  }
  MEGATRON_FAIL("cp_attention_backward: unknown communication type");
}

}  // namespace megatron::parallel
