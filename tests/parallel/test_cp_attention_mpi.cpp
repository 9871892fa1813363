// Context-parallel attention across real ranks (mpiexec -np 4, CPU, F64 and F32): for every communication
// type -- p2p (the ring), a2a, all_gather, a2a+p2p (2 x 2 hierarchical) -- at CP = 2 (two groups side by side)
// and CP = 4, MHA, GQA and MQA where the type allows, one and two sequences per micro-batch, each rank holds
// its load-balanced chunks of whole sequences and the forward and backward must equal whole-sequence causal
// attention computed on one rank, chunk for chunk (out, dq, dk, dv), without and with attention dropout (every
// type draws the whole sequence's masks at its tokens' positions and heads). On 2, 4 or 8
// GPUs (ContextParallelAttentionGpu, CP over every rank) the ring by the copy engines (--cp-comm-transport copy-engine) gives the NCCL
// ring's results bit for bit: the same kernels on the same blocks, only the transport differs.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/ops/slices/slices.h"
#include "megatron/parallel/cp_attention.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/parallel/ring_attention.h"
#include "mpi_world.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#endif

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

#if MEGATRON_WITH_NCCL
TEST(ContextParallelAttentionGpu, RingByCopyEnginesEqualsTheNcclRing) {
  auto world = mpi_world();
  const int count = cuda_device_count();
  if (count == 0 || world->size() < 2 || mpi_runtime().local_size() > count)  // the ring over every rank
    GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  const Device device = Device::cuda(mpi_runtime().local_rank() % count);
  auto ctx = Context::create(device);
  std::shared_ptr<comm::Communicator> nccl =
      comm::NcclCommunicator::create(*world, device.index, "cp", comm::timeout_from_minutes(2.0));
  const ContextParallel by_nccl{.group = nccl};
  ContextParallel by_copy_engines{.group = nccl};
  by_copy_engines.ring_peers = std::make_shared<RingPeers>();
  const int64_t B = 1, c = 96, H = 8, G = 4, D = 64, local_seq = 2 * c;
  for (int round = 0; round < 3; ++round) {  // the two slots of each exchange reused, in both passes
    SCOPED_TRACE(str_cat("round ", round));
    auto random = [&](const Shape& s, const std::string& what) {
      Tensor host = cpu_context().empty(s, DType::BF16);
      fill_random(host, seed_from(str_cat("cp ring ", what, round, "#", world->rank())));
      Tensor x = ctx->empty(s, DType::BF16);
      copy_tensor(*ctx, x, host);
      return x;
    };
    const Tensor q = random({B, local_seq, H, D}, "q"), k = random({B, local_seq, G, D}, "k"),
                 v = random({B, local_seq, G, D}, "v"), dout = random({B, local_seq, H, D}, "dout");
    const ops::AttentionOptions causal{.causal = true};
    std::vector<std::vector<double>> results[2];
    for (int transport = 0; transport < 2; ++transport) {
      const ContextParallel& cp = transport == 0 ? by_nccl : by_copy_engines;
      Tensor out = ctx->empty(q.shape(), DType::BF16);
      CpAttentionSaved saved = cp_attention_forward(*ctx, cp, CpCommType::P2P, out, q, k, v, causal);
      Tensor dq = ctx->empty(q.shape(), DType::BF16), dk = ctx->empty(k.shape(), DType::BF16),
             dv = ctx->empty(v.shape(), DType::BF16);
      cp_attention_backward(*ctx, cp, CpCommType::P2P, std::move(saved), dq, dk, dv, dout, causal);
      ctx->synchronize();
      for (const Tensor& t : {out, dq, dk, dv}) results[transport].push_back(to_doubles(*ctx, t));
    }
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_EQ(results[0][i].size(), results[1][i].size());
      size_t differing = 0;
      for (size_t j = 0; j < results[0][i].size(); ++j) differing += results[0][i][j] != results[1][i][j];
      EXPECT_EQ(differing, 0u) << names[i] << ": elements that differ from the NCCL ring's";
    }
  }
  // The GPUs of one machine map each other's memory: the copy engines carried the blocks, not NCCL.
  EXPECT_NE(by_copy_engines.ring_peers->kv.get(*ctx, *nccl, 1), nullptr);
  EXPECT_NE(by_copy_engines.ring_peers->grads.get(*ctx, *nccl, 1), nullptr);
}
#endif

}  // namespace
}  // namespace megatron::parallel
