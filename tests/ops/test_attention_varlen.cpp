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

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
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

// ---- dropout: each document draws the masks its rows have in the whole batch's P ----

ops::AttentionDropout by_index(float p, int64_t seq) {
  return {.p = p, .masks = ops::DropoutMasks::ByIndex, .seed = 5, .offset = 17, .seq = seq};
}

// A packed micro-batch [B, S] whose every sample is one whole document is dense attention over [B, S, heads, D]:
// with dropout the two ops draw the same masks (the packed op places document i at sequence i of P).
TEST(AttentionVarlen, DropoutOverWholeSamplesEqualsDenseAttention) {
  Context& ctx = cpu_context();
  const int64_t B = 3, S = 11, H = 4, G = 2, D = 5;
  const AttentionOptions options{.causal = true, .dropout = by_index(0.3f, S)};
  const Tensor q = random_tensor({B * S, H, D}, DType::F64, "whole_q"), k = random_tensor({B * S, G, D}, DType::F64, "whole_k"),
               v = random_tensor({B * S, G, D}, DType::F64, "whole_v"), dout = random_tensor({B * S, H, D}, DType::F64, "whole_do");
  const Tensor cu = host_offsets({0, S, 2 * S, 3 * S});
  Tensor out = ctx.empty(q.shape(), DType::F64), stats = ctx.empty({H, B * S}, DType::F32);
  Tensor dq = ctx.empty(q.shape(), DType::F64), dk = ctx.empty(k.shape(), DType::F64), dv = ctx.empty(k.shape(), DType::F64);
  ops::attention_forward_varlen(ctx, out, stats, q, k, v, cu, cu, options);
  ops::attention_backward_varlen(ctx, dq, dk, dv, dout, q, k, v, out, stats, cu, cu, options);
  auto batch = [&](const Tensor& t) { return t.view({B, S, t.dim(1), D}); };
  Tensor o = ctx.empty({B, S, H, D}, DType::F64), st = ctx.empty({B, H, S, 1}, DType::F32);
  Tensor gq = ctx.empty({B, S, H, D}, DType::F64), gk = ctx.empty({B, S, G, D}, DType::F64), gv = ctx.empty({B, S, G, D}, DType::F64);
  ops::attention_forward(ctx, o, st, batch(q), batch(k), batch(v), options);
  ops::attention_backward(ctx, gq, gk, gv, batch(dout), batch(q), batch(k), batch(v), o, st, options);
  EXPECT_LE(max_abs_diff(to_doubles(ctx, out), to_doubles(ctx, o)), 1e-12);
  EXPECT_LE(max_abs_diff(to_doubles(ctx, dq), to_doubles(ctx, gq)), 1e-12);
  EXPECT_LE(max_abs_diff(to_doubles(ctx, dk), to_doubles(ctx, gk)), 1e-12);
  EXPECT_LE(max_abs_diff(to_doubles(ctx, dv), to_doubles(ctx, gv)), 1e-12);
  // Dropout did act: without it the outputs differ.
  Tensor plain = ctx.empty(q.shape(), DType::F64);
  ops::attention_forward_varlen(ctx, plain, stats, q, k, v, cu, cu, AttentionOptions{.causal = true});
  EXPECT_GT(max_abs_diff(to_doubles(ctx, plain), to_doubles(ctx, out)), 1e-3);
}

// Documents inside samples, independently of the op's addressing: plain loops over the document mask with the
// factors of the whole batch's P (attention_dropout_factors of the dense [B, heads, S, S] call, query row = the
// token's position in its sample).
TEST(AttentionVarlen, DropoutForwardEqualsLoopsOverTheWholeBatchMasks) {
  Context& ctx = cpu_context();
  const int64_t S = 13, H = 4, G = 2, D = 6;
  const std::vector<int64_t> cu = {0, 5, 6, 13, 13, 20, 26};  // sample 0: 5 + 1 + 7 tokens; sample 1: 7 + 6
  const int64_t T = cu.back();
  const ops::AttentionDropout dropout = by_index(0.25f, S);
  const Tensor q = random_tensor({T, H, D}, DType::F64, "loops_q"), k = random_tensor({T, G, D}, DType::F64, "loops_k"),
               v = random_tensor({T, G, D}, DType::F64, "loops_v");
  Tensor out = ctx.empty({T, H, D}, DType::F64), stats = ctx.empty({H, T}, DType::F32);
  ops::attention_forward_varlen(ctx, out, stats, q, k, v, host_offsets(cu), host_offsets(cu),
                                AttentionOptions{.causal = true, .dropout = dropout});
  auto document = [&](int64_t t) { return std::upper_bound(cu.begin(), cu.end(), t) - cu.begin(); };
  const double scale = double(float(1.0 / std::sqrt(double(D))));
  std::vector<double> factor(static_cast<size_t>(S));
  int64_t dropped = 0;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G), b = i / S;
      ops::attention_dropout_factors(dropout, H, S, b, h, i % S, S, factor.data());
      std::vector<double> w(size_t(T), 0.0);
      double m = -INFINITY, sum = 0;
      auto visible = [&](int64_t j) { return j <= i && document(j) == document(i); };
      for (int64_t j = 0; j < T; ++j) {
        if (!visible(j)) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q.data<double>()[(i * H + h) * D + d] * k.data<double>()[(j * G + g) * D + d];
        m = std::max(m, w[size_t(j)] = scale * dot);
      }
      for (int64_t j = 0; j < T; ++j) sum += visible(j) ? (w[size_t(j)] = std::exp(w[size_t(j)] - m)) : 0.0;
      for (int64_t j = 0; j < T; ++j) {
        w[size_t(j)] = visible(j) ? w[size_t(j)] / sum * factor[size_t(j % S)] : 0.0;
        dropped += visible(j) && factor[size_t(j % S)] == 0.0;
      }
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j < T; ++j) o += w[size_t(j)] * v.data<double>()[(j * G + g) * D + d];
        ASSERT_NEAR(out.data<double>()[(i * H + h) * D + d], o, 1e-12) << "token " << i << " head " << h;
      }
      ASSERT_NEAR(stats.data<float>()[h * T + i], m + std::log(sum), 1e-5);  // the undropped statistics
    }
  EXPECT_GT(dropped, 0);
}

TEST(AttentionVarlen, DropoutRefusesDocumentsAcrossSamplesAndOtherAddressing) {
  Context& ctx = cpu_context();
  const Tensor q = random_tensor({8, 2, 4}, DType::F32, "drop_q"), k = random_tensor({8, 2, 4}, DType::F32, "drop_k");
  Tensor out = ctx.empty(q.shape(), DType::F32), stats = ctx.empty({2, 8}, DType::F32);
  auto run = [&](const ops::AttentionDropout& d, std::vector<int64_t> cu) {
    ops::attention_forward_varlen(ctx, out, stats, q, k, k, host_offsets(cu), host_offsets(cu),
                                  AttentionOptions{.causal = true, .dropout = d});
  };
  expect_error([&] { run(by_index(0.1f, 4), {0, 3, 6, 8}); },
               {"attention_forward_varlen", "sequence 1", "query rows [3, 6)", "inside one of P's sequences of 4"});
  expect_error([&] { run(by_index(0.1f, 0), {0, 4, 8}); }, {"attention_forward_varlen", "needs dropout.seq"});
  ops::AttentionDropout with_runs = by_index(0.1f, 4);
  with_runs.queries = {{0, 0, 8}};
  expect_error([&] { run(with_runs, {0, 4, 8}); }, {"attention_forward_varlen", "leave dropout.queries"});
  run(by_index(0.1f, 4), {0, 1, 4, 4, 8});  // documents of 1 and 3 tokens, an empty one, a whole sample: fine
}

GradCase varlen_dropout_grad_case() {
  GradCase c = varlen_grad_case("self_causal_dropout", 2, 1, 3, {0, 4, 5, 9}, {0, 4, 5, 9}, true);
  c.name = "self_causal_dropout_samples_of_5";
  const Shape qs{9, 2, 3}, ks{9, 1, 3};
  const AttentionOptions options{.causal = true, .dropout = by_index(0.3f, 5)};
  const std::vector<int64_t> cu = {0, 4, 5, 9};
  c.forward = [=](Context& ctx, const std::vector<Tensor>& in) {
    Tensor out = ctx.empty(qs, DType::F64), stats = ctx.empty({2, 9}, DType::F32);
    ops::attention_forward_varlen(ctx, out, stats, in[0], in[1], in[2], host_offsets(cu), host_offsets(cu), options);
    return std::vector<Tensor>{out};
  };
  c.backward = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& grad_out) {
    Tensor out = ctx.empty(qs, DType::F64), stats = ctx.empty({2, 9}, DType::F32);
    const Tensor o = host_offsets(cu);
    ops::attention_forward_varlen(ctx, out, stats, in[0], in[1], in[2], o, o, options);
    Tensor dq = ctx.empty(qs, DType::F64), dk = ctx.empty(ks, DType::F64), dv = ctx.empty(ks, DType::F64);
    ops::attention_backward_varlen(ctx, dq, dk, dv, grad_out[0], in[0], in[1], in[2], out, stats, o, o, options);
    return std::vector<Tensor>{dq, dk, dv};
  };
  return c;
}

std::vector<GradCase> grad_cases() {
  return {varlen_grad_case("self_causal_3_documents", 2, 1, 3, {0, 4, 5, 9}, {0, 4, 5, 9}, true),
          varlen_grad_case("gqa_causal_with_empty", 4, 2, 2, {0, 3, 3, 7}, {0, 3, 3, 7}, true),
          varlen_grad_case("more_keys_causal", 2, 2, 3, {0, 2, 5}, {0, 4, 9}, true),
          varlen_grad_case("full", 2, 1, 4, {0, 3, 4}, {0, 2, 6}, false), varlen_dropout_grad_case()};
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

// cuDNN's own generator over packed documents (two samples of 128 tokens: documents of 40 and 88, then one of
// 128). With V one-hot over each document's positions (D = 128 >= every document) the output row of a query is
// its row of P o M / (1 - p), so the mask is read off the forward: the visible probabilities drop at rate p
// (within five standard deviations of n / 4 draws, as for dense attention: cuDNN's masks repeat within blocks of
// rows), kept ones are the undropped run's times 1 / (1 - p), the same call repeats its bits, and the backward
// applies the forward's mask: dV = (P o M / (1 - p))^T dO, summed over each group's heads, from the read-off mask.
TEST(AttentionVarlenDropoutGpu, DeviceDropoutDropsAtTheRateAndTheBackwardUsesTheForwardsMask) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = cuda_context();
  const int64_t S = 128, H = 4, G = 2, D = 128;
  const std::vector<int64_t> cu = {0, 40, 128, 256};
  const int64_t T = cu.back();
  auto start_of = [&](int64_t t) { return *(std::upper_bound(cu.begin(), cu.end(), t) - 1); };
  auto upload = [&](const Tensor& host) { return to_device(gpu, host, gpu.device(), cpu_context().allocator()); };
  Tensor one_hot = cpu_context().empty({T, G, D}, DType::BF16);
  {
    Tensor f64 = cpu_context().empty({T, G, D}, DType::F64);
    std::fill_n(f64.data<double>(), f64.numel(), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < G; ++g) f64.data<double>()[(t * G + g) * D + (t - start_of(t))] = 1.0;
    ops::cast(cpu_context(), one_hot, f64);
  }
  const Tensor q = upload(random_tensor({T, H, D}, DType::BF16, "gpu_drop_q")),
               k = upload(random_tensor({T, G, D}, DType::BF16, "gpu_drop_k")), v = upload(one_hot),
               dout = upload(random_tensor({T, H, D}, DType::BF16, "gpu_drop_do"));
  const Tensor cu_host = host_offsets(cu);
  struct Run {
    std::vector<double> out, dv;
  };
  auto run = [&](const ops::AttentionDropout& dropout) {
    const AttentionOptions options{.causal = true, .dropout = dropout};
    Tensor out = gpu.empty({T, H, D}, DType::BF16), stats = gpu.empty({H, T}, DType::F32);
    Tensor dq = gpu.empty({T, H, D}, DType::BF16), dk = gpu.empty({T, G, D}, DType::BF16), dv = gpu.empty({T, G, D}, DType::BF16);
    ops::attention_forward_varlen(gpu, out, stats, q, k, v, cu_host, cu_host, options);
    ops::attention_backward_varlen(gpu, dq, dk, dv, dout, q, k, v, out, stats, cu_host, cu_host, options);
    return Run{to_doubles(gpu, out), to_doubles(gpu, dv)};
  };
  const std::vector<double> d_out = to_doubles(gpu, dout);
  const Run plain = run({});
  for (float prob : {0.1f, 0.5f}) {
    SCOPED_TRACE(str_cat("p = ", prob));
    const ops::AttentionDropout dropout{.p = prob, .seed = 11, .offset = 3, .seq = S};
    const Run dropped = run(dropout);
    const double scale = 1.0 / (1.0 - double(prob));
    auto at = [&](int64_t i, int64_t h, int64_t c) { return size_t((i * H + h) * D + c); };
    int64_t visible = 0, zeros = 0;
    std::vector<double> dv_want(size_t(T * G * D), 0.0);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = start_of(i); j <= i; ++j) {
          const size_t e = at(i, h, j - start_of(i));
          ++visible;
          if (dropped.out[e] == 0.0) ++zeros;
          else EXPECT_NEAR(dropped.out[e], plain.out[e] * scale, 2e-2 * plain.out[e] * scale) << i << " " << h << " " << j;
          for (int64_t c = 0; c < D; ++c)
            dv_want[size_t((j * G + h / (H / G)) * D + c)] += dropped.out[e] * d_out[at(i, h, c)];
        }
    const double n = double(visible) / 4, sigma = std::sqrt(double(prob) * (1.0 - prob) / n);
    EXPECT_NEAR(double(zeros) / double(visible), double(prob), 5 * sigma) << zeros << " of " << visible;
    EXPECT_LE(nmse(dropped.dv, dv_want), 2e-4);
    EXPECT_EQ(run(dropout).out, dropped.out);
  }
  // By-index masks have no path over ragged sequences on CUDA.
  const ops::AttentionDropout by_index_masks{.p = 0.1f, .masks = ops::DropoutMasks::ByIndex, .seq = S};
  Tensor out = gpu.empty({T, H, D}, DType::BF16), stats = gpu.empty({H, T}, DType::F32);
  expect_error([&] {
    ops::attention_forward_varlen(gpu, out, stats, q, k, v, cu_host, cu_host,
                                  AttentionOptions{.causal = true, .dropout = by_index_masks});
  }, {"attention_forward_varlen", "by-index dropout masks over packed sequences are not supported on CUDA"});
}

}  // namespace
}  // namespace megatron::testing
