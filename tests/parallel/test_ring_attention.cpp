// Ring attention's arithmetic (parallel/ring_attention.h) against whole-sequence attention: every rank's
// steps of a ring of P ranks run on one device (each rank's chunks cut from whole sequences, the blocks and
// merges of the real ring, the key/value gradients added to their owner's), and the results put back in
// sequence order must equal one causal attention call over the whole sequences:
//   CPU, F64 and F32: forward out and stats, backward dq, dk and dv, for P = 1..4, MHA and GQA (and MQA),
//   one and two sequences per batch (views vs copies of the halves), chunks of 1 and 3 tokens, without and
//   with attention dropout (each block draws the whole sequence's masks);
//   GPU (the op harness): the same simulation in bf16/fp16 through cuDNN vs the CPU reference, so the GPU
//   path's partial blocks, bottom-right causal offsets, merges and accumulations are covered.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/ops/attention/attention.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/slices/slices.h"
#include "megatron/parallel/ring_attention.h"

namespace megatron::parallel {
namespace {

using namespace megatron::testing;

constexpr int kSeq = 1, kStatsSeq = 2;  // the sequence dimension of q-like tensors and of stats

Shape with_extent(const Shape& s, int dim, int64_t n) {
  std::vector<int64_t> d = s.dims();
  d[size_t(dim)] = n;
  return Shape(d);
}

// Rank r's local tensor (chunks r and 2P-1-r of the whole sequences along `dim`), and its way back.
Tensor local_of(Context& ctx, const Tensor& whole, int P, int r, int dim) {
  const int64_t c = whole.dim(dim) / (2 * P);
  Tensor local = ctx.empty(with_extent(whole.shape(), dim, 2 * c), whole.dtype());
  ops::copy_slices(ctx, local, 0, whole, int64_t(r) * c, c, dim);
  ops::copy_slices(ctx, local, c, whole, int64_t(2 * P - 1 - r) * c, c, dim);
  return local;
}
void put_back(Context& ctx, const Tensor& whole, const Tensor& local, int P, int r, int dim) {
  const int64_t c = whole.dim(dim) / (2 * P);
  ops::copy_slices(ctx, whole, int64_t(r) * c, local, 0, c, dim);
  ops::copy_slices(ctx, whole, int64_t(2 * P - 1 - r) * c, local, c, c, dim);
}

const ops::AttentionOptions kCausal{.causal = true};

// Every rank's forward steps; out and stats assigned in sequence order.
void ring_forward_on_one_device(Context& ctx, int P, const Tensor& out, const Tensor& stats, const Tensor& q,
                                const Tensor& k, const Tensor& v, const ops::AttentionOptions& options = kCausal) {
  for (int r = 0; r < P; ++r) {
    const Tensor q_r = local_of(ctx, q, P, r, kSeq);
    Tensor out_r = ctx.empty(q_r.shape(), q.dtype());
    Tensor stats_r = ctx.empty(with_extent(stats.shape(), kStatsSeq, q_r.dim(1)), DType::F32);
    for (int step = 0; step < P; ++step) {
      const RingStep at{r, P, step};
      ring_attention_forward_step(ctx, at, out_r, stats_r, q_r, local_of(ctx, k, P, at.owner(), kSeq),
                                  local_of(ctx, v, P, at.owner(), kSeq), options);
    }
    put_back(ctx, out, out_r, P, r, kSeq);
    put_back(ctx, stats, stats_r, P, r, kStatsSeq);
  }
}

// Every rank's backward steps; dq, dk, dv assigned in sequence order.
void ring_backward_on_one_device(Context& ctx, int P, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& stats,
                                 const ops::AttentionOptions& options = kCausal) {
  std::vector<Tensor> dk_of, dv_of;  // each owner's block gradient, summed over the ranks that attended it
  for (int j = 0; j < P; ++j) {
    dk_of.push_back(local_of(ctx, k, P, j, kSeq));
    dv_of.push_back(local_of(ctx, v, P, j, kSeq));
    ops::fill(ctx, dk_of.back(), 0.0);
    ops::fill(ctx, dv_of.back(), 0.0);
  }
  for (int r = 0; r < P; ++r) {
    const Tensor q_r = local_of(ctx, q, P, r, kSeq), dout_r = local_of(ctx, dout, P, r, kSeq);
    const Tensor out_r = local_of(ctx, out, P, r, kSeq), stats_r = local_of(ctx, stats, P, r, kStatsSeq);
    Tensor dq_r = ctx.empty(q_r.shape(), q.dtype());
    for (int step = 0; step < P; ++step) {
      const RingStep at{r, P, step};
      const int j = at.owner();
      const RingBlockGrads g = ring_attention_backward_step(ctx, at, dq_r, dout_r, q_r, local_of(ctx, k, P, j, kSeq),
                                                            local_of(ctx, v, P, j, kSeq), out_r, stats_r, options);
      ops::copy_slices(ctx, dk_of[size_t(j)], 0, g.dk, 0, g.dk.dim(1), kSeq, /*accumulate=*/true);
      ops::copy_slices(ctx, dv_of[size_t(j)], 0, g.dv, 0, g.dv.dim(1), kSeq, /*accumulate=*/true);
    }
    put_back(ctx, dq, dq_r, P, r, kSeq);
  }
  for (int j = 0; j < P; ++j) {
    put_back(ctx, dk, dk_of[size_t(j)], P, j, kSeq);
    put_back(ctx, dv, dv_of[size_t(j)], P, j, kSeq);
  }
}

struct Problem {
  int P;
  int64_t B, c, H, G, D;
  DType dtype;
  int64_t S() const { return 2 * P * c; }
  Shape q() const { return {B, S(), H, D}; }
  Shape kv() const { return {B, S(), G, D}; }
  Shape stats() const { return {B, H, S(), 1}; }
  std::string name() const {
    return str_cat(dtype_name(dtype), "_P", P, "_B", B, "_c", c, "_H", H, "_G", G, "_D", D);
  }
};

Tensor random_cpu(const Shape& s, DType dt, uint64_t seed) {
  Tensor x = cpu_context().empty(s, dt);
  fill_random(x, seed);
  return x;
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

TEST(RingAttention, EqualsWholeSequenceAttentionOnCpu) {
  Context& ctx = cpu_context();
  for (DType dt : {DType::F64, DType::F32})
    for (int P : {1, 2, 3, 4})
      for (int64_t B : {1, 2})
        for (auto [H, G] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {3, 1}})
          for (int64_t c : {1, 3})
            for (float dropout : {0.0f, 0.3f}) {
              const Problem p{P, B, c, H, G, 8, dt};
              SCOPED_TRACE(p.name() + str_cat(" attention dropout ", dropout));
              const uint64_t seed = seed_from(p.name());
              const Tensor q = random_cpu(p.q(), dt, seed), k = random_cpu(p.kv(), dt, seed + 1),
                           v = random_cpu(p.kv(), dt, seed + 2), dout = random_cpu(p.q(), dt, seed + 3);
              // Attention dropout: every block draws the whole sequence's masks (the ring addresses its blocks).
              const ops::AttentionOptions options{.causal = true,
                                                  .dropout = {.p = dropout, .seed = 3, .offset = 41, .seq = p.S()}};
              Tensor out = ctx.empty(p.q(), dt), stats = ctx.empty(p.stats(), DType::F32);
              ops::attention_forward(ctx, out, stats, q, k, v, options);
              Tensor dq = ctx.empty(p.q(), dt), dk = ctx.empty(p.kv(), dt), dv = ctx.empty(p.kv(), dt);
              ops::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, options);

              Tensor ring_out = ctx.empty(p.q(), dt), ring_stats = ctx.empty(p.stats(), DType::F32);
              ring_forward_on_one_device(ctx, P, ring_out, ring_stats, q, k, v, options);
              Tensor ring_dq = ctx.empty(p.q(), dt), ring_dk = ctx.empty(p.kv(), dt), ring_dv = ctx.empty(p.kv(), dt);
              ring_backward_on_one_device(ctx, P, ring_dq, ring_dk, ring_dv, dout, q, k, v, ring_out, ring_stats,
                                          options);

              // The statistics are fp32 even for F64 tensors (the op's contract), and the merge weights
              // exp(lse_a - lse) carry their rounding: about 1e-8 relative; dropout scales the kept
              // probabilities, and their rounding, by 1 / (1 - p).
              const double tol = (dt == DType::F64 ? 2e-7 : 2e-6) / (1.0 - dropout);
              EXPECT_LE(max_rel_diff(ctx, ring_out, out), tol) << "out";
              EXPECT_LE(max_rel_diff(ctx, ring_stats, stats), 1e-6) << "stats (F32)";
              EXPECT_LE(max_rel_diff(ctx, ring_dq, dq), tol) << "dq";
              EXPECT_LE(max_rel_diff(ctx, ring_dk, dk), tol) << "dk";
              EXPECT_LE(max_rel_diff(ctx, ring_dv, dv), tol) << "dv";
            }
}

// The op harness's GPU comparison of the ring simulation (CUDA vs the CPU reference of the same steps,
// which the test above ties to whole-sequence attention).
std::vector<OpCase> ring_cases() {
  std::vector<OpCase> cases;
  const std::vector<Problem> problems = {
      {2, 1, 64, 4, 2, 64, DType::BF16}, {2, 2, 48, 4, 4, 64, DType::BF16}, {4, 1, 32, 8, 2, 128, DType::BF16},
      {3, 1, 40, 4, 1, 64, DType::F16},  {4, 2, 16, 2, 2, 32, DType::BF16}};
  for (const Problem& p : problems) {
    const double io = p.dtype == DType::BF16 ? 2e-4 : 2e-6;
    OpCase f;
    f.name = "fwd_" + p.name();
    f.inputs = {{p.q(), p.dtype}, {p.kv(), p.dtype}, {p.kv(), p.dtype}};
    f.outputs = {{p.q(), p.dtype}, {p.stats(), DType::F32}};
    f.max_nmse = {io, 1e-8};
    f.run = [p](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      ring_forward_on_one_device(ctx, p.P, out[0], out[1], in[0], in[1], in[2]);
    };
    cases.push_back(f);
    OpCase b;
    b.name = "bwd_" + p.name();
    b.inputs = {{p.q(), p.dtype}, {p.kv(), p.dtype}, {p.kv(), p.dtype}, {p.q(), p.dtype}};
    b.outputs = {{p.q(), p.dtype}, {p.kv(), p.dtype}, {p.kv(), p.dtype}};
    b.max_nmse = {io, io, io};
    b.run = [p](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      Tensor o = ctx.empty(p.q(), p.dtype), stats = ctx.empty(p.stats(), DType::F32);
      ring_forward_on_one_device(ctx, p.P, o, stats, in[0], in[1], in[2]);
      ring_backward_on_one_device(ctx, p.P, out[0], out[1], out[2], in[3], in[0], in[1], in[2], o, stats);
    };
    cases.push_back(b);
  }
  return cases;
}

MEGATRON_OP_CASES(RingAttentionOps, ring_cases);

// On the GPU the ring's result and one whole-sequence cuDNN call are both within bf16 tolerance of the
// fp64 whole-sequence reference (normalised squared error, as the attention op's own tests).
TEST(RingAttentionGpu, MatchesWholeSequenceAttentionWithinBf16Tolerance) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = cuda_context();
  Context& cpu = cpu_context();
  for (int P : {2, 4}) {
    const Problem p{P, 1, 256, 8, 2, 128, DType::BF16};
    SCOPED_TRACE(p.name());
    const uint64_t seed = seed_from(p.name());
    const Tensor q = random_cpu(p.q(), p.dtype, seed), k = random_cpu(p.kv(), p.dtype, seed + 1),
                 v = random_cpu(p.kv(), p.dtype, seed + 2), dout = random_cpu(p.q(), p.dtype, seed + 3);
    auto widen = [&](const Tensor& x) {
      Tensor y = cpu.empty(x.shape(), DType::F64);
      ops::cast(cpu, y, x);
      return y;
    };
    // The fp64 reference from the same bf16 inputs.
    Tensor ref_out = cpu.empty(p.q(), DType::F64), ref_stats = cpu.empty(p.stats(), DType::F32);
    ops::attention_forward(cpu, ref_out, ref_stats, widen(q), widen(k), widen(v), kCausal);
    Tensor ref_dq = cpu.empty(p.q(), DType::F64), ref_dk = cpu.empty(p.kv(), DType::F64), ref_dv = cpu.empty(p.kv(), DType::F64);
    ops::attention_backward(cpu, ref_dq, ref_dk, ref_dv, widen(dout), widen(q), widen(k), widen(v), ref_out, ref_stats, kCausal);

    auto upload = [&](const Tensor& x) {
      Tensor y = gpu.empty(x.shape(), x.dtype());
      ops::copy(gpu, y, x);
      return y;
    };
    const Tensor gq = upload(q), gk = upload(k), gv = upload(v), gdout = upload(dout);
    for (bool ring : {false, true}) {
      Tensor out = gpu.empty(p.q(), p.dtype), stats = gpu.empty(p.stats(), DType::F32);
      Tensor dq = gpu.empty(p.q(), p.dtype), dk = gpu.empty(p.kv(), p.dtype), dv = gpu.empty(p.kv(), p.dtype);
      if (ring) {
        ring_forward_on_one_device(gpu, P, out, stats, gq, gk, gv);
        ring_backward_on_one_device(gpu, P, dq, dk, dv, gdout, gq, gk, gv, out, stats);
      } else {
        ops::attention_forward(gpu, out, stats, gq, gk, gv, kCausal);
        ops::attention_backward(gpu, dq, dk, dv, gdout, gq, gk, gv, out, stats, kCausal);
      }
      const char* what = ring ? "ring" : "whole";
      EXPECT_LE(nmse(to_doubles(gpu, out), to_doubles(cpu, ref_out)), 2e-4) << what << " out";
      EXPECT_LE(nmse(to_doubles(gpu, stats), to_doubles(cpu, ref_stats)), 1e-8) << what << " stats";
      EXPECT_LE(nmse(to_doubles(gpu, dq), to_doubles(cpu, ref_dq)), 2e-4) << what << " dq";
      EXPECT_LE(nmse(to_doubles(gpu, dk), to_doubles(cpu, ref_dk)), 2e-4) << what << " dk";
      EXPECT_LE(nmse(to_doubles(gpu, dv), to_doubles(cpu, ref_dv)), 2e-4) << what << " dv";
    }
  }
}

}  // namespace
}  // namespace megatron::parallel
