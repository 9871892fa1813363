// Context-parallel attention across real ranks (mpiexec -np 4, CPU, F64 and F32): for every communication
// type -- p2p (the ring), a2a, all_gather, a2a+p2p (2 x 2 hierarchical) -- at CP = 2 (two groups side by side)
// and CP = 4, MHA, GQA and MQA where the type allows, one and two sequences per micro-batch, each rank holds
// its load-balanced chunks of whole sequences and the forward and backward must equal whole-sequence causal
// attention computed on one rank, chunk for chunk (out, dq, dk, dv), without and with attention dropout (every
// type draws the whole sequence's masks at its tokens' positions and heads).
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/ops/slices/slices.h"
#include "megatron/parallel/cp_attention.h"
#include "megatron/parallel/parallel_context.h"
#include "mpi_world.h"

namespace megatron::parallel {
namespace {

using namespace megatron::testing;

Tensor local_chunks(Context& ctx, const Tensor& whole, const SequenceSplit& split) {
  const int64_t c = split.chunk();
  Tensor local = ctx.empty({whole.dim(0), 2 * c, whole.dim(2), whole.dim(3)}, whole.dtype());
  ops::copy_slices(ctx, local, 0, whole, split.global_position(0), c, 1);
  ops::copy_slices(ctx, local, c, whole, split.global_position(c), c, 1);
  return local;
}

double max_rel_diff(Context& ctx, const Tensor& got, const Tensor& want) {
  const std::vector<double> g = to_doubles(ctx, got), w = to_doubles(ctx, want);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff = std::max(diff, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  return diff / std::max(scale, 1e-30);
}

struct Case {
  int64_t B, c, H, G;
  DType dtype;
};

// Every rank of `cp` computes its chunks with `type` and compares them with the whole-sequence result.
void expect_matches_whole(const ContextParallel& cp, CpCommType type, const Case& k, float dropout) {
  Context& ctx = cpu_context();
  const int P = cp.size();
  const int64_t S = 2 * P * k.c, D = 8;
  SCOPED_TRACE(str_cat(cp_comm_type_name(type), " CP=", P, " B=", k.B, " c=", k.c, " H=", k.H, " G=", k.G, " ",
                       dtype_name(k.dtype), " attention dropout ", dropout));
  const uint64_t seed = seed_from(str_cat("cp", P, k.B, k.c, k.H, k.G));
  auto random = [&](const Shape& s, uint64_t offset) {
    Tensor x = ctx.empty(s, k.dtype);
    fill_random(x, seed + offset);
    return x;
  };
  const Tensor q = random({k.B, S, k.H, D}, 0), kk = random({k.B, S, k.G, D}, 1), v = random({k.B, S, k.G, D}, 2),
               dout = random({k.B, S, k.H, D}, 3);
  // With attention dropout the whole sequence's call and every rank's calls address the same [B, H, S, S].
  const ops::AttentionOptions causal{.causal = true, .dropout = {.p = dropout, .seed = 9, .offset = 17, .seq = S}};
  Tensor out = ctx.empty(q.shape(), k.dtype), stats = ctx.empty({k.B, k.H, S, 1}, DType::F32);
  ops::attention_forward(ctx, out, stats, q, kk, v, causal);
  Tensor dq = ctx.empty(q.shape(), k.dtype), dk = ctx.empty(kk.shape(), k.dtype), dv = ctx.empty(v.shape(), k.dtype);
  ops::attention_backward(ctx, dq, dk, dv, dout, q, kk, v, out, stats, causal);

  const SequenceSplit split = cp.split(S);
  auto local = [&](const Tensor& x) { return local_chunks(ctx, x, split); };
  const Tensor lq = local(q), lk = local(kk), lv = local(v);
  Tensor lout = ctx.empty(lq.shape(), k.dtype);
  CpAttentionSaved saved = cp_attention_forward(ctx, cp, type, lout, lq, lk, lv, causal);
  Tensor ldq = ctx.empty(lq.shape(), k.dtype), ldk = ctx.empty(lk.shape(), k.dtype), ldv = ctx.empty(lv.shape(), k.dtype);
  cp_attention_backward(ctx, cp, type, std::move(saved), ldq, ldk, ldv, local(dout), causal);

  // The ring merges partial results with fp32 statistics (the attention op's contract, even for F64), whose
  // rounding enters the merge weights: about 1e-8 relative; the types without merges match to rounding.
  const bool merges = type == CpCommType::P2P || type == CpCommType::A2AP2P;
  const double tol = k.dtype == DType::F64 ? (merges ? 3e-7 : 1e-11) : 3e-6;
  EXPECT_LE(max_rel_diff(ctx, lout, local(out)), tol) << "out";
  EXPECT_LE(max_rel_diff(ctx, ldq, local(dq)), tol) << "dq";
  EXPECT_LE(max_rel_diff(ctx, ldk, local(dk)), tol) << "dk";
  EXPECT_LE(max_rel_diff(ctx, ldv, local(dv)), tol) << "dv";
}

std::vector<Case> cases_for(CpCommType type, int heads_split) {
  std::vector<Case> out;
  for (DType dt : {DType::F64, DType::F32})
    for (int64_t B : {1, 2})
      for (auto [H, G] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}}) {
        const bool a2a = type == CpCommType::A2A || type == CpCommType::A2AP2P;
        if (a2a && (H % heads_split != 0 || G % heads_split != 0)) continue;  // refused by the flags' rules
        out.push_back({B, dt == DType::F64 ? 3 : 2, H, G, dt});
      }
  return out;
}

TEST(ContextParallelAttention, EveryTypeEqualsWholeSequenceAttention) {
  auto world = mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  for (int P : {2, 4}) {
    // Two CP = 2 groups ({0, 1} and {2, 3}) run side by side; CP = 4 is the whole world.
    const ContextParallel base{.group = world->split(world->rank() / P, world->rank(), str_cat("cp", P))};
    for (CpCommType type : {CpCommType::P2P, CpCommType::A2A, CpCommType::AllGather})
      for (const Case& k : cases_for(type, P))
        for (float dropout : {0.0f, 0.2f}) expect_matches_whole(base, type, k, dropout);
  }
  // a2a+p2p: all-to-all within {0, 1} and {2, 3}, the ring across them (Megatron's hierarchical groups).
  const ParallelContext pc = ParallelContext::create(world, {.context_parallel = 4, .hierarchical_context_parallel = {2, 2}});
  ASSERT_EQ(pc.hierarchical_cp().size(), 2u);
  EXPECT_EQ(pc.hierarchical_cp()[0].ranks, (std::vector<int>{world->rank() / 2 * 2, world->rank() / 2 * 2 + 1}));
  EXPECT_EQ(pc.hierarchical_cp()[1].ranks, (std::vector<int>{world->rank() % 2, world->rank() % 2 + 2}));
  const ContextParallel hierarchical{.group = pc.cp().comm, .a2a_group = pc.hierarchical_cp()[0].comm,
                                     .p2p_group = pc.hierarchical_cp()[1].comm};
  for (const Case& k : cases_for(CpCommType::A2AP2P, 2))
    for (float dropout : {0.0f, 0.2f}) expect_matches_whole(hierarchical, CpCommType::A2AP2P, k, dropout);
}

}  // namespace
}  // namespace megatron::parallel
