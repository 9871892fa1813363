// Packed (variable-length, THD) attention against per-document attention: random head shapes, document
// lengths (empty documents and single tokens included) and dtypes (fp32, fp64), self-attention and the
// bottom-right aligned form with more keys than queries per document; the forward also against an
// independent dense computation with an explicit block-diagonal causal mask (no score may cross a document);
// gradients against finite differences in fp64; and the refusals. On a GPU: cuDNN's ragged-offset attention
// against that CPU reference on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "harness.h"
#include "megatron/ops/attention/attention_varlen.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::testing {
namespace {

using ops::AttentionOptions;

Tensor host_offsets(const std::vector<int64_t>& v) {
  Tensor t = cpu_context().empty({int64_t(v.size())}, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

Tensor random_tensor(const Shape& shape, DType dt, const std::string& seed) {
  Tensor t = cpu_context().empty(shape, dt);
  fill_random(t, seed_from(seed));
  return t;
}

// A packed problem: document i has lq[i] queries and lk[i] keys.
struct Packed {
  int64_t H, G, D;
  DType dtype;
  std::vector<int64_t> lq, lk;
  std::vector<int64_t> cu(const std::vector<int64_t>& lengths) const {
    std::vector<int64_t> c = {0};
    for (int64_t l : lengths) c.push_back(c.back() + l);
    return c;
  }
  int64_t tq() const { return cu(lq).back(); }
  int64_t tk() const { return cu(lk).back(); }
};

// Random documents: lengths 0..max (0 and 1 included), keys = queries + extra (extra 0: self-attention).
Packed random_problem(uint32_t seed, DType dtype, int64_t extra_keys) {
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Packed p{.H = 0, .G = pick(1, 3), .D = pick(1, 9), .dtype = dtype};
  p.H = p.G * pick(1, 3);
  const int64_t documents = pick(1, 6);
  for (int64_t i = 0; i < documents; ++i) {
    const int64_t l = i == 0 ? 0 : i == 1 ? 1 : pick(0, 80);
    p.lq.push_back(l);
    p.lk.push_back(l + (l > 0 ? extra_keys : 0));
  }
  return p;
}

// The rows [begin, end) of a [T, heads, D] tensor, copied into a batch of one.
Tensor document_rows(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out = cpu_context().empty({1, end - begin, t.dim(1), t.dim(2)}, t.dtype());
  ops::copy(cpu_context(), out.view({end - begin, t.dim(1), t.dim(2)}), t.slice(begin, end));
  return out;
}

void expect_rows_equal(const Tensor& packed, int64_t begin, const Tensor& own, double tolerance, const char* what) {
  const std::vector<double> got = to_doubles(cpu_context(), packed.slice(begin, begin + own.dim(1)));
  const std::vector<double> want = to_doubles(cpu_context(), own);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tolerance) << what << " element " << i;
}

void expect_packed_equals_documents(const Packed& p, bool causal, const std::string& name) {
  SCOPED_TRACE(name);
  Context& ctx = cpu_context();
  const int64_t Tq = p.tq(), Tk = p.tk();
  const Tensor q = random_tensor({Tq, p.H, p.D}, p.dtype, name + "q"), k = random_tensor({Tk, p.G, p.D}, p.dtype, name + "k"),
               v = random_tensor({Tk, p.G, p.D}, p.dtype, name + "v"), dout = random_tensor({Tq, p.H, p.D}, p.dtype, name + "do");
  const Tensor cu_q = host_offsets(p.cu(p.lq)), cu_k = host_offsets(p.cu(p.lk));
  const AttentionOptions options{.causal = causal};
  Tensor out = ctx.empty(q.shape(), p.dtype), stats = ctx.empty({p.H, Tq}, DType::F32);
  Tensor dq = ctx.empty(q.shape(), p.dtype), dk = ctx.empty(k.shape(), p.dtype), dv = ctx.empty(k.shape(), p.dtype);
  for (const Tensor* t : {&out, &stats, &dq, &dk, &dv}) poison(ctx, *t);
  ops::attention_forward_varlen(ctx, out, stats, q, k, v, cu_q, cu_k, options);
  ops::attention_backward_varlen(ctx, dq, dk, dv, dout, q, k, v, out, stats, cu_q, cu_k, options);
  const double tol = p.dtype == DType::F64 ? 1e-12 : 1e-6;
  const std::vector<int64_t> oq = p.cu(p.lq), ok = p.cu(p.lk);
  for (size_t i = 0; i < p.lq.size(); ++i) {
    SCOPED_TRACE(str_cat("document ", i, " (", p.lq[i], " queries, ", p.lk[i], " keys)"));
    if (p.lq[i] == 0) {  // its keys (if any) get no gradient
      for (double x : to_doubles(ctx, dk.slice(ok[i], ok[i + 1]))) ASSERT_EQ(x, 0.0);
      continue;
    }
    const Tensor q_i = document_rows(q, oq[i], oq[i + 1]), k_i = document_rows(k, ok[i], ok[i + 1]),
                 v_i = document_rows(v, ok[i], ok[i + 1]), do_i = document_rows(dout, oq[i], oq[i + 1]);
    Tensor o_i = ctx.empty(q_i.shape(), p.dtype), s_i = ctx.empty({1, p.H, p.lq[i], 1}, DType::F32);
    ops::attention_forward(ctx, o_i, s_i, q_i, k_i, v_i, options);
    expect_rows_equal(out, oq[i], o_i, tol, "out");
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t j = 0; j < p.lq[i]; ++j)
        ASSERT_EQ(stats.data<float>()[h * Tq + oq[i] + j], s_i.data<float>()[h * p.lq[i] + j]) << "stats " << h << "," << j;
    Tensor gq = ctx.empty(q_i.shape(), p.dtype), gk = ctx.empty(k_i.shape(), p.dtype), gv = ctx.empty(k_i.shape(), p.dtype);
    ops::attention_backward(ctx, gq, gk, gv, do_i, q_i, k_i, v_i, o_i, s_i, options);
    expect_rows_equal(dq, oq[i], gq, tol, "dq");
    expect_rows_equal(dk, ok[i], gk, tol, "dk");
    expect_rows_equal(dv, ok[i], gv, tol, "dv");
  }
}

TEST(AttentionVarlen, PackedEqualsPerDocumentAttention) {
  uint32_t seed = 1;
  for (DType dt : {DType::F64, DType::F32})
    for (int trial = 0; trial < 6; ++trial) {
      expect_packed_equals_documents(random_problem(seed, dt, 0), true, str_cat("self causal ", seed));
      expect_packed_equals_documents(random_problem(seed + 100, dt, 3), true, str_cat("more keys causal ", seed));
      expect_packed_equals_documents(random_problem(seed + 200, dt, 2), false, str_cat("full ", seed));
      ++seed;
    }
}

// Independent of the kernel: softmax(scale q.k) over the keys of the query's own document at or before it,
// by plain loops, on one packed self-attention row.
TEST(AttentionVarlen, ForwardEqualsDenseAttentionWithDocumentMask) {
  Context& ctx = cpu_context();
  const int64_t H = 4, G = 2, D = 6;
  const std::vector<int64_t> cu = {0, 5, 6, 6, 19, 30};
  const int64_t T = cu.back();
  const Tensor q = random_tensor({T, H, D}, DType::F64, "dense_q"), k = random_tensor({T, G, D}, DType::F64, "dense_k"),
               v = random_tensor({T, G, D}, DType::F64, "dense_v");
  Tensor out = ctx.empty({T, H, D}, DType::F64), stats = ctx.empty({H, T}, DType::F32);
  ops::attention_forward_varlen(ctx, out, stats, q, k, v, host_offsets(cu), host_offsets(cu));
  auto document = [&](int64_t t) { return std::upper_bound(cu.begin(), cu.end(), t) - cu.begin(); };
  const double scale = double(float(1.0 / std::sqrt(double(D))));  // the op keeps its scale as a float
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      std::vector<double> w(size_t(T), 0.0);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        if (j > i || document(j) != document(i)) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q.data<double>()[(i * H + h) * D + d] * k.data<double>()[(j * G + g) * D + d];
        w[size_t(j)] = scale * dot;
        m = std::max(m, w[size_t(j)]);
      }
      for (int64_t j = 0; j < T; ++j)
        if (j <= i && document(j) == document(i)) sum += (w[size_t(j)] = std::exp(w[size_t(j)] - m));
        else w[size_t(j)] = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j < T; ++j) o += w[size_t(j)] / sum * v.data<double>()[(j * G + g) * D + d];
        ASSERT_NEAR(out.data<double>()[(i * H + h) * D + d], o, 1e-12) << "token " << i << " head " << h;
      }
      ASSERT_NEAR(stats.data<float>()[h * T + i], m + std::log(sum), 1e-5);
    }
}

GradCase varlen_grad_case(std::string name, int64_t H, int64_t G, int64_t D, std::vector<int64_t> cu_q,
                          std::vector<int64_t> cu_k, bool causal) {
  GradCase c;
  c.name = name;
  const Shape qs{cu_q.back(), H, D}, ks{cu_k.back(), G, D};
  c.inputs = {{qs}, {ks}, {ks}};
  c.differentiable = {0, 1, 2};
  const AttentionOptions options{.causal = causal};
  c.forward = [=](Context& ctx, const std::vector<Tensor>& in) {
    Tensor out = ctx.empty(qs, DType::F64), stats = ctx.empty({H, qs[0]}, DType::F32);
    ops::attention_forward_varlen(ctx, out, stats, in[0], in[1], in[2], host_offsets(cu_q), host_offsets(cu_k), options);
    return std::vector<Tensor>{out};
  };
  c.backward = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& grad_out) {
    Tensor out = ctx.empty(qs, DType::F64), stats = ctx.empty({H, qs[0]}, DType::F32);
    const Tensor oq = host_offsets(cu_q), ok = host_offsets(cu_k);
    ops::attention_forward_varlen(ctx, out, stats, in[0], in[1], in[2], oq, ok, options);
    Tensor dq = ctx.empty(qs, DType::F64), dk = ctx.empty(ks, DType::F64), dv = ctx.empty(ks, DType::F64);
    ops::attention_backward_varlen(ctx, dq, dk, dv, grad_out[0], in[0], in[1], in[2], out, stats, oq, ok, options);
    return std::vector<Tensor>{dq, dk, dv};
  };
  c.max_rel_error = 1e-5;
  return c;
}

std::vector<GradCase> grad_cases() {
  return {varlen_grad_case("self_causal_3_documents", 2, 1, 3, {0, 4, 5, 9}, {0, 4, 5, 9}, true),
          varlen_grad_case("gqa_causal_with_empty", 4, 2, 2, {0, 3, 3, 7}, {0, 3, 3, 7}, true),
          varlen_grad_case("more_keys_causal", 2, 2, 3, {0, 2, 5}, {0, 4, 9}, true),
          varlen_grad_case("full", 2, 1, 4, {0, 3, 4}, {0, 2, 6}, false)};
}
MEGATRON_GRAD_CASES(AttentionVarlen, grad_cases);

TEST(AttentionVarlen, CountsOnlyTheComputedPairs) {
  const Tensor self = host_offsets({0, 4, 4, 7}), keys = host_offsets({0, 6, 6, 9});
  EXPECT_EQ(ops::attention_varlen_pairs(self, self, true), 10.0 + 6.0);
  EXPECT_EQ(ops::attention_varlen_pairs(self, keys, true), (10.0 + 4 * 2) + 6.0);
  EXPECT_EQ(ops::attention_varlen_pairs(self, keys, false), 24.0 + 9.0);
}

TEST(AttentionVarlen, RefusesBadOffsets) {
  Context& ctx = cpu_context();
  const Tensor q = random_tensor({6, 2, 4}, DType::F32, "bad_q"), k = random_tensor({6, 2, 4}, DType::F32, "bad_k");
  Tensor out = ctx.empty(q.shape(), DType::F32), stats = ctx.empty({2, 6}, DType::F32);
  expect_error([&] { ops::attention_forward_varlen(ctx, out, stats, q, k, k, host_offsets({0, 5}), host_offsets({0, 5})); },
               {"attention_forward_varlen", "cu_seqlens must run from 0", "6 rows"});
  expect_error([&] { ops::attention_forward_varlen(ctx, out, stats, q, k, k, host_offsets({0, 4, 6}), host_offsets({0, 5, 6})); },
               {"attention_forward_varlen", "sequence 1 has 2 queries and 1 keys"});
  expect_error([&] { ops::attention_forward_varlen(ctx, out, stats, q, k, k, host_offsets({0, 4, 2, 6}), host_offsets({0, 4, 2, 6})); },
               {"attention_forward_varlen", "must not decrease"});
  expect_error([&] { ops::attention_forward_varlen(ctx, out, stats, q, k, k, host_offsets({0, 6}), host_offsets({0, 3, 6})); },
               {"attention_forward_varlen", "the same number of sequences"});
}

// ---- CUDA: cuDNN's fused attention with ragged offsets against the CPU reference ----

struct GpuPacked {
  std::string name;
  int64_t H, G, D;
  DType dtype;
  bool causal;
  std::vector<int64_t> lq;
  int64_t extra_keys = 0;  // keys = queries + extra_keys per non-empty document (bottom-right causal)
};

// Forward (out, stats) and backward from each device's own forward (dq, dk, dv), as the dense attention's GPU
// cases do; documents of 0 and 1 tokens, lengths around cuDNN's 64-row tiles, and one past a power of two.
std::vector<OpCase> varlen_gpu_cases() {
  const std::vector<GpuPacked> problems = {
      {"mixed_bf16", 4, 2, 64, DType::BF16, true, {0, 1, 63, 64, 65, 200, 513}},
      {"mha_d128_bf16", 8, 8, 128, DType::BF16, true, {300, 1, 17, 1024}},
      {"mqa_full_f16", 4, 1, 64, DType::F16, false, {5, 130, 77}},
      {"more_keys_bf16", 4, 2, 64, DType::BF16, true, {33, 1, 90}, 5},
      {"two_long_bf16", 16, 8, 128, DType::BF16, true, {2048, 1500, 548}},
  };
  std::vector<OpCase> cases;
  for (const GpuPacked& p : problems) {
    std::vector<int64_t> cq = {0}, ck = {0};
    for (int64_t l : p.lq) {
      cq.push_back(cq.back() + l);
      ck.push_back(ck.back() + l + (l > 0 ? p.extra_keys : 0));
    }
    // The offsets live in the cases, which gtest keeps until after the contexts' allocators are gone: host tensors
    // over this memory rather than from an allocator.
    const auto offsets = std::make_shared<std::vector<int64_t>>(cq);
    offsets->insert(offsets->end(), ck.begin(), ck.end());
    const auto cu = [offsets, nq = int64_t(cq.size())](bool keys) {
      return Tensor::from_blob(offsets->data() + (keys ? nq : 0), {nq}, DType::I64, Device::cpu());
    };
    const Shape qs{cq.back(), p.H, p.D}, ks{ck.back(), p.G, p.D}, ss{p.H, cq.back()};
    const AttentionOptions options{.causal = p.causal};
    const double io = p.dtype == DType::BF16 ? 2e-4 : 2e-6;  // test_attention.cpp's limits
    OpCase fwd;
    fwd.name = "varlen_fwd_" + p.name;
    fwd.inputs = {{qs, p.dtype}, {ks, p.dtype}, {ks, p.dtype}};
    fwd.outputs = {{qs, p.dtype}, {ss, DType::F32}};
    fwd.max_nmse = {io, 1e-8};
    fwd.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      ops::attention_forward_varlen(ctx, out[0], out[1], in[0], in[1], in[2], cu(false), cu(true), options);
    };
    cases.push_back(fwd);
    OpCase bwd;
    bwd.name = "varlen_bwd_" + p.name;
    bwd.inputs = {{qs, p.dtype}, {ks, p.dtype}, {ks, p.dtype}, {qs, p.dtype}};
    bwd.outputs = {{qs, p.dtype}, {ks, p.dtype}, {ks, p.dtype}};
    bwd.max_nmse = {io, io, io};
    bwd.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      Tensor o = ctx.empty(qs, p.dtype), stats = ctx.empty(ss, DType::F32);
      ops::attention_forward_varlen(ctx, o, stats, in[0], in[1], in[2], cu(false), cu(true), options);
      ops::attention_backward_varlen(ctx, out[0], out[1], out[2], in[3], in[0], in[1], in[2], o, stats, cu(false),
                                     cu(true), options);
    };
    cases.push_back(bwd);
  }
  return cases;
}

class AttentionVarlenGpu : public ::testing::TestWithParam<OpCase> {};
TEST_P(AttentionVarlenGpu, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, AttentionVarlenGpu, ::testing::ValuesIn(varlen_gpu_cases()),
                         [](const auto& info) { return gtest_name(info.param.name); });

}  // namespace
}  // namespace megatron::testing
