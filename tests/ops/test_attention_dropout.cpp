// Attention dropout (ops/attention/attention_dropout.h) on the CPU reference attention:
//   - forward and backward against plain fp64 loops that draw each probability's mask straight from Philox at
//     its index in the whole [B, heads, seq, seq] tensor (head offsets, query and key runs, causal and full,
//     GQA, Sq != Skv, rows across the kernel's 64-row blocks);
//   - finite differences of the backward in fp64 (the mask is a fixed function of the addressing);
//   - the dropped fraction within statistical bounds, kept probabilities scaled by exactly 1 / (1 - p);
//   - parts of the tensor (a tensor-parallel rank's heads, a context-parallel rank's query chunks) draw the
//     whole tensor's masks;
//   - the same addressing gives the same bits at every thread count, another offset or seed other masks;
//   - bad addressing is an error naming it; on a GPU dropout is refused with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/philox.h"
#include "megatron/ops/attention/attention.h"

namespace megatron {
namespace {

using namespace megatron::testing;
using ops::AttentionOptions;

struct Problem {
  int64_t B, Sq, Skv, H, G, D;
  bool causal;
  ops::AttentionDropout dropout;

  Shape q_shape() const { return {B, Sq, H, D}; }
  Shape kv_shape() const { return {B, Skv, G, D}; }
  Shape stats_shape() const { return {B, H, Sq, 1}; }
  AttentionOptions options() const { return {.causal = causal, .dropout = dropout}; }
  std::string name() const {
    return str_cat("B", B, "_Sq", Sq, "_Skv", Skv, "_H", H, "_G", G, "_D", D, causal ? "_causal" : "_full", "_p",
                   int(dropout.p * 100), "_heads", dropout.heads, "_from", dropout.head_offset, "_runs",
                   dropout.queries.size(), dropout.keys.size());
  }
};

ops::AttentionDropout dropout(float p, uint64_t offset = 7) { return {.p = p, .seed = 1234, .offset = offset}; }

Tensor random_cpu(const Shape& shape, const std::string& seed) {
  Tensor t = cpu_context().empty(shape, DType::F64);
  fill_random(t, seed_from(seed));
  return t;
}

// The mask factor of the call's (b, h, query row i, key row j), from the contract alone.
double plain_factor(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const ops::AttentionDropout& d = p.dropout;
  if (!d.enabled()) return 1.0;
  auto position = [](const std::vector<ops::PositionRun>& runs, int64_t row) {
    for (const ops::PositionRun& r : runs)
      if (row >= r.row && row < r.row + r.count) return r.position + row - r.row;
    return row;
  };
  const int64_t heads = d.heads > 0 ? d.heads : p.H, seq = d.seq > 0 ? d.seq : p.Skv;
  const uint64_t index =
      uint64_t(((b * heads + d.head_offset + h) * seq + position(d.queries, i)) * seq + position(d.keys, j));
  return philox_uniform(d.seed, d.offset, index) >= d.p ? 1.0 / (1.0 - double(d.p)) : 0.0;
}

struct Plain {
  std::vector<double> out, dq, dk, dv;
};

// out = (P o F) V with P = softmax(scale q.k) over the visible keys and F the factors; the backward by the
// chain rule through the mask and the softmax (delta = sum_j P_j dP_j with dP = F o dO.v).
Plain plain_attention(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  const int64_t D = p.D, group = p.H / p.G;
  const double scale = ops::attention_scale(p.options(), D);
  const double *Q = q.data<double>(), *K = k.data<double>(), *V = v.data<double>(), *dO = dout.data<double>();
  Plain r{std::vector<double>(size_t(q.numel())), std::vector<double>(size_t(q.numel())),
          std::vector<double>(size_t(k.numel())), std::vector<double>(size_t(k.numel()))};
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        const int64_t qi = ((b * p.Sq + i) * p.H + h) * D;
        auto kj = [&](int64_t j) { return ((b * p.Skv + j) * p.G + h / group) * D; };
        const int64_t visible = p.causal ? i + (p.Skv - p.Sq) + 1 : p.Skv;
        std::vector<double> prob(static_cast<size_t>(visible)), dprob(static_cast<size_t>(visible));
        double m = -INFINITY, sum = 0, delta = 0;
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += Q[qi + c] * K[kj(j) + c];
          prob[size_t(j)] = scale * dot;
          m = std::max(m, prob[size_t(j)]);
        }
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(prob[size_t(j)] - m);
        for (int64_t j = 0; j < visible; ++j) {
          prob[size_t(j)] = std::exp(prob[size_t(j)] - m) / sum;
          const double f = plain_factor(p, b, h, i, j);
          for (int64_t c = 0; c < D; ++c) {
            r.out[size_t(qi + c)] += prob[size_t(j)] * f * V[kj(j) + c];
            dprob[size_t(j)] += f * dO[qi + c] * V[kj(j) + c];
          }
          delta += prob[size_t(j)] * dprob[size_t(j)];
        }
        for (int64_t j = 0; j < visible; ++j) {
          const double ds = prob[size_t(j)] * (dprob[size_t(j)] - delta), f = plain_factor(p, b, h, i, j);
          for (int64_t c = 0; c < D; ++c) {
            r.dq[size_t(qi + c)] += scale * ds * K[kj(j) + c];
            r.dk[size_t(kj(j) + c)] += scale * ds * Q[qi + c];
            r.dv[size_t(kj(j) + c)] += prob[size_t(j)] * f * dO[qi + c];
          }
        }
      }
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct Result {
  Tensor out, stats, dq, dk, dv;
};

Result run_op(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  Context& ctx = cpu_context();
  Result r{ctx.empty(p.q_shape(), DType::F64), ctx.empty(p.stats_shape(), DType::F32), ctx.empty(p.q_shape(), DType::F64),
           ctx.empty(p.kv_shape(), DType::F64), ctx.empty(p.kv_shape(), DType::F64)};
  ops::attention_forward(ctx, r.out, r.stats, q, k, v, p.options());
  ops::attention_backward(ctx, r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.stats, p.options());
  return r;
}

// Problems whose addressing exercises every part of the contract.
std::vector<Problem> problems() {
  ops::AttentionDropout heads = dropout(0.3f);
  heads.heads = 8;
  heads.head_offset = 4;  // the second tensor-parallel rank's half of 8 heads
  ops::AttentionDropout chunks = dropout(0.2f);
  chunks.seq = 12;        // a context-parallel rank (CP = 2, rank 1) holding chunks 1 and 2 of 4 of 3 positions
  chunks.queries = ops::two_chunk_runs(2, 1, 3);
  chunks.keys = ops::two_chunk_runs(2, 1, 3);
  ops::AttentionDropout prefix = dropout(0.5f, 99);
  prefix.seq = 20;        // queries at positions 14..19 over keys 0..19 (all-gather's prefix)
  prefix.queries = {{0, 14, 6}};
  return {{2, 7, 7, 4, 2, 5, true, dropout(0.1f)},   {1, 70, 70, 2, 1, 3, true, dropout(0.25f)},
          {1, 5, 9, 4, 4, 4, false, dropout(0.4f)},  {2, 3, 8, 4, 2, 3, true, dropout(0.3f)},
          {1, 6, 6, 4, 2, 4, true, heads},           {2, 6, 6, 2, 1, 4, true, chunks},
          {1, 6, 20, 2, 2, 3, true, prefix},         {1, 4, 4, 2, 2, 3, true, dropout(0.0f)}};
}

TEST(AttentionDropout, MatchesPlainLoopsWithTheSameMasks) {
  Context& ctx = cpu_context();
  for (const Problem& p : problems()) {
    SCOPED_TRACE(p.name());
    const Tensor q = random_cpu(p.q_shape(), "q" + p.name()), k = random_cpu(p.kv_shape(), "k" + p.name()),
                 v = random_cpu(p.kv_shape(), "v" + p.name()), dout = random_cpu(p.q_shape(), "do" + p.name());
    const Result r = run_op(p, q, k, v, dout);
    const Plain want = plain_attention(p, q, k, v, dout);
    EXPECT_LT(max_abs_diff(to_doubles(ctx, r.out), want.out), 1e-12);
    // The backward reads the fp32 stats: probabilities carry ~1e-7 relative error.
    EXPECT_LT(max_abs_diff(to_doubles(ctx, r.dq), want.dq), 1e-6);
    EXPECT_LT(max_abs_diff(to_doubles(ctx, r.dk), want.dk), 1e-6);
    EXPECT_LT(max_abs_diff(to_doubles(ctx, r.dv), want.dv), 1e-6);
  }
}

// The mask changes the function, not its smoothness: the analytic gradients are the finite differences'.
GradCase grad_case(const Problem& p) {
  GradCase c;
  c.name = p.name();
  c.inputs = {{p.q_shape()}, {p.kv_shape()}, {p.kv_shape()}};
  c.differentiable = {0, 1, 2};
  c.forward = [p](Context& ctx, const std::vector<Tensor>& in) {
    Tensor out = ctx.empty(p.q_shape(), DType::F64), stats = ctx.empty(p.stats_shape(), DType::F32);
    ops::attention_forward(ctx, out, stats, in[0], in[1], in[2], p.options());
    return std::vector<Tensor>{out};
  };
  c.backward = [p](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& grad_out) {
    Tensor out = ctx.empty(p.q_shape(), DType::F64), stats = ctx.empty(p.stats_shape(), DType::F32);
    ops::attention_forward(ctx, out, stats, in[0], in[1], in[2], p.options());
    Tensor dq = ctx.empty(p.q_shape(), DType::F64), dk = ctx.empty(p.kv_shape(), DType::F64),
           dv = ctx.empty(p.kv_shape(), DType::F64);
    ops::attention_backward(ctx, dq, dk, dv, grad_out[0], in[0], in[1], in[2], out, stats, p.options());
    return std::vector<Tensor>{dq, dk, dv};
  };
  c.max_rel_error = 1e-5;  // stats are fp32 by contract
  return c;
}
std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (const Problem& p : problems())
    if (p.Sq * p.H * p.D <= 256) cases.push_back(grad_case(p));
  return cases;
}
MEGATRON_GRAD_CASES(AttentionDropout, grad_cases);

// With V the identity over the keys (D = Skv, v[j] = e_j) the output row is the row of P o F itself: the
// dropped fraction of the visible probabilities is p within five standard deviations, and every kept one is
// the undropped probability times exactly 1 / (1 - p).
TEST(AttentionDropout, DropsTheExpectedFractionAndScalesTheRest) {
  Context& ctx = cpu_context();
  const int64_t B = 2, S = 64, H = 4;
  for (float prob : {0.1f, 0.5f}) {
    const Problem p{B, S, S, H, H, S, false, dropout(prob, 5)};
    Problem plain = p;
    plain.dropout = {};
    const Tensor q = random_cpu(p.q_shape(), "frac_q"), k = random_cpu(p.kv_shape(), "frac_k");
    Tensor v = ctx.empty(p.kv_shape(), DType::F64);
    std::vector<double> one_hot(size_t(v.numel()), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < S; ++j)
        for (int64_t g = 0; g < H; ++g) one_hot[size_t(((b * S + j) * H + g) * S + j)] = 1.0;
    std::copy(one_hot.begin(), one_hot.end(), v.data<double>());
    Tensor out = ctx.empty(p.q_shape(), DType::F64), base = ctx.empty(p.q_shape(), DType::F64);
    Tensor stats = ctx.empty(p.stats_shape(), DType::F32);
    ops::attention_forward(ctx, out, stats, q, k, v, p.options());
    ops::attention_forward(ctx, base, stats, q, k, v, plain.options());
    const std::vector<double> dropped = to_doubles(ctx, out), whole = to_doubles(ctx, base);
    int64_t zeros = 0;
    const double scale = 1.0 / (1.0 - double(prob));
    for (size_t e = 0; e < dropped.size(); ++e) {
      if (dropped[e] == 0.0) ++zeros;
      else EXPECT_NEAR(dropped[e], whole[e] * scale, 1e-15 * scale) << "element " << e;
    }
    const double n = double(dropped.size()), sigma = std::sqrt(double(prob) * (1.0 - prob) / n);
    EXPECT_NEAR(double(zeros) / n, double(prob), 5 * sigma) << zeros << " of " << n << " dropped at p = " << prob;
  }
}

// A tensor-parallel rank's heads (head_offset) and a context-parallel rank's query chunks (query runs) draw
// the whole tensor's masks: their outputs are the whole call's rows.
TEST(AttentionDropout, PartsOfTheTensorDrawTheWholeTensorsMasks) {
  Context& ctx = cpu_context();
  const int64_t B = 2, S = 12, H = 4, D = 3, c = 3;
  const Problem whole{B, S, S, H, H, D, false, dropout(0.3f)};
  const Tensor q = random_cpu(whole.q_shape(), "part_q"), k = random_cpu(whole.kv_shape(), "part_k"),
               v = random_cpu(whole.kv_shape(), "part_v");
  Tensor out = ctx.empty(whole.q_shape(), DType::F64), stats = ctx.empty(whole.stats_shape(), DType::F32);
  ops::attention_forward(ctx, out, stats, q, k, v, whole.options());
  const std::vector<double> want = to_doubles(ctx, out);
  auto element = [&](int64_t b, int64_t s, int64_t h, int64_t d) { return want[size_t(((b * S + s) * H + h) * D + d)]; };

  // Heads [2, 4) alone, addressed from head 2 of 4.
  auto heads_of = [&](const Tensor& t, int64_t from, int64_t n) {
    Tensor r = ctx.empty({B, S, n, D}, DType::F64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < n; ++h)
          for (int64_t d = 0; d < D; ++d)
            r.data<double>()[((b * S + s) * n + h) * D + d] = t.data<double>()[((b * S + s) * H + from + h) * D + d];
    return r;
  };
  Problem half = whole;
  half.H = half.G = 2;
  half.dropout.heads = H;
  half.dropout.head_offset = 2;
  Tensor half_out = ctx.empty(half.q_shape(), DType::F64), half_stats = ctx.empty(half.stats_shape(), DType::F32);
  ops::attention_forward(ctx, half_out, half_stats, heads_of(q, 2, 2), heads_of(k, 2, 2), heads_of(v, 2, 2),
                         half.options());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < D; ++d)
          EXPECT_EQ(half_out.data<double>()[((b * S + s) * 2 + h) * D + d], element(b, s, 2 + h, d));

  // Context-parallel rank 0 of 2: query chunks 0 and 3 (positions 0..2 and 9..11) over every key.
  Problem rank0 = whole;
  rank0.Sq = 2 * c;
  rank0.dropout.seq = S;
  rank0.dropout.queries = ops::two_chunk_runs(2, 0, c);
  Tensor local_q = ctx.empty(rank0.q_shape(), DType::F64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 2 * c; ++i) {
      const int64_t s = ops::position_of(rank0.dropout.queries, i);
      std::copy_n(q.data<double>() + (b * S + s) * H * D, H * D, local_q.data<double>() + (b * 2 * c + i) * H * D);
    }
  Tensor local_out = ctx.empty(rank0.q_shape(), DType::F64), local_stats = ctx.empty(rank0.stats_shape(), DType::F32);
  ops::attention_forward(ctx, local_out, local_stats, local_q, k, v, rank0.options());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 2 * c; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          EXPECT_EQ(local_out.data<double>()[((b * 2 * c + i) * H + h) * D + d],
                    element(b, ops::position_of(rank0.dropout.queries, i), h, d));
}

// Deterministic: the same addressing gives the same bits at every thread count; another offset or seed gives
// other masks (and so another output and other gradients).
TEST(AttentionDropout, SameAddressSameBitsOtherAddressOtherMasks) {
  Context& ctx = cpu_context();
  const Problem p{2, 70, 70, 4, 2, 8, true, dropout(0.1f)};
  const Tensor q = random_cpu(p.q_shape(), "det_q"), k = random_cpu(p.kv_shape(), "det_k"),
               v = random_cpu(p.kv_shape(), "det_v"), dout = random_cpu(p.q_shape(), "det_do");
  std::vector<std::vector<double>> first;
  for (int threads : kThreadCounts) {
    ScopedCpuThreads scoped(threads);
    const Result r = run_op(p, q, k, v, dout);
    const std::vector<std::vector<double>> got = {to_doubles(ctx, r.out), to_doubles(ctx, r.dq), to_doubles(ctx, r.dk),
                                                  to_doubles(ctx, r.dv)};
    if (first.empty()) first = got;
    else EXPECT_EQ(got, first) << threads << " threads";
  }
  for (auto change : {+[](Problem& x) { x.dropout.offset += 1; }, +[](Problem& x) { x.dropout.seed += 1; }}) {
    Problem other = p;
    change(other);
    const Result r = run_op(other, q, k, v, dout);
    EXPECT_GT(max_abs_diff(to_doubles(ctx, r.out), first[0]), 1e-3);
    EXPECT_GT(max_abs_diff(to_doubles(ctx, r.dv), first[3]), 1e-3);
  }
}

TEST(AttentionDropoutBadInput, AddressingOutsideTheTensor) {
  Context& ctx = cpu_context();
  Problem p{1, 6, 6, 2, 2, 4, true, dropout(0.1f)};
  const Tensor q = random_cpu(p.q_shape(), "bad_q"), k = random_cpu(p.kv_shape(), "bad_k");
  Tensor out = ctx.empty(p.q_shape(), DType::F64), stats = ctx.empty(p.stats_shape(), DType::F32);
  auto forward = [&](const Problem& x) { ops::attention_forward(ctx, out, stats, q, k, k, x.options()); };
  Problem heads = p;
  heads.dropout.heads = 3;
  heads.dropout.head_offset = 2;
  expect_error([&] { forward(heads); }, {"attention_forward", "options.dropout", "2 heads from head 2", "3 heads"});
  Problem gap = p;
  gap.dropout.seq = 12;
  gap.dropout.queries = {{0, 0, 3}, {4, 6, 2}};
  expect_error([&] { forward(gap); }, {"attention_forward", "queries", "does not continue at row 3"});
  Problem short_runs = p;
  short_runs.dropout.keys = {{0, 0, 4}};
  expect_error([&] { forward(short_runs); }, {"attention_forward", "number 4 keys but the call has 6"});
  Problem outside = p;
  outside.dropout.queries = {{0, 3, 6}};
  expect_error([&] { forward(outside); }, {"attention_forward", "inside P's 6 positions"});
  Problem one = p;
  one.dropout.p = 1.0f;
  expect_error([&] { forward(one); }, {"attention_forward", "must be in [0, 1)"});
}

TEST(AttentionDropoutGpu, RefusedWithTheReason) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = cuda_context();
  const Problem p{1, 8, 8, 2, 2, 64, true, dropout(0.1f)};
  Tensor q = ctx.empty(p.q_shape(), DType::BF16), k = ctx.empty(p.kv_shape(), DType::BF16);
  Tensor out = ctx.empty(p.q_shape(), DType::BF16), stats = ctx.empty(p.stats_shape(), DType::F32);
  expect_error([&] { ops::attention_forward(ctx, out, stats, q, k, k, p.options()); },
               {"attention_forward", "CPU only", "not the CPU's mask by element index"});
}

}  // namespace
}  // namespace megatron
