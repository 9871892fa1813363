// Attention dropout (ops/attention/attention_dropout.h) on the CPU reference attention:
//   - forward and backward against plain fp64 loops that draw each probability's mask straight from Philox at
//     its index in the whole [B, heads, seq, seq] tensor (head offsets, query and key runs, causal and full,
//     GQA, Sq != Skv, rows across the kernel's 64-row blocks);
//   - finite differences of the backward in fp64 (the mask is a fixed function of the addressing);
//   - the dropped fraction within statistical bounds, kept probabilities scaled by exactly 1 / (1 - p);
//   - parts of the tensor (a tensor-parallel rank's heads, a context-parallel rank's query chunks) draw the
//     whole tensor's masks;
//   - the same addressing gives the same bits at every thread count, another offset or seed other masks;
//   - bad addressing is an error naming it;
//   - the by-index mask op (what cuDNN gets on GPUs with DropoutMasks::ByIndex) is the contract's keep bit of
//     every element, on the CPU and bit for bit on the GPU; the device-stream seeds differ wherever the
//     addressing does;
//   - on a GPU: by-index dropout's outputs and gradients are the CPU reference's (the same masks), and cuDNN's own
//     generator (DropoutMasks::Device) drops at the rate, scales the rest by 1 / (1 - p), repeats its masks for
//     the same addressing only, and its backward applies the forward's mask (gradients from the mask read off
//     the forward's output); where cuDNN has no dropout the op says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/philox.h"
#include "megatron/ops/attention/attention.h"
#include "megatron/ops/elementwise/elementwise.h"

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
      uint64_t((((d.batch_offset + b) * heads + d.head_offset + h) * seq + position(d.queries, i)) * seq +
               position(d.keys, j));
  return philox_uniform(d.seed, d.offset, index) >= d.p ? 1.0 / (1.0 - double(d.p)) : 0.0;
}

struct Plain {
  std::vector<double> out, dq, dk, dv;
};

using Factor = std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)>;

// out = (P o F) V with P = softmax(scale q.k) over the visible keys and F the factors; the backward by the
// chain rule through the mask and the softmax (delta = sum_j P_j dP_j with dP = F o dO.v). q, k, v and dout
// are F64 CPU tensors.
Plain plain_attention(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const Factor& factor) {
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
          const double f = factor(b, h, i, j);
          for (int64_t c = 0; c < D; ++c) {
            r.out[size_t(qi + c)] += prob[size_t(j)] * f * V[kj(j) + c];
            dprob[size_t(j)] += f * dO[qi + c] * V[kj(j) + c];
          }
          delta += prob[size_t(j)] * dprob[size_t(j)];
        }
        for (int64_t j = 0; j < visible; ++j) {
          const double ds = prob[size_t(j)] * (dprob[size_t(j)] - delta), f = factor(b, h, i, j);
          for (int64_t c = 0; c < D; ++c) {
            r.dq[size_t(qi + c)] += scale * ds * K[kj(j) + c];
            r.dk[size_t(kj(j) + c)] += scale * ds * Q[qi + c];
            r.dv[size_t(kj(j) + c)] += prob[size_t(j)] * f * dO[qi + c];
          }
        }
      }
  return r;
}

Plain plain_attention(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  return plain_attention(p, q, k, v, dout, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return plain_factor(p, b, h, i, j);
  });
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
  ops::AttentionDropout document = dropout(0.3f, 7);
  document.seq = 9;       // a packed document: positions 3..6 of the micro-batch's second sample
  document.batch_offset = 1;
  document.queries = {{0, 3, 4}};
  document.keys = {{0, 3, 4}};
  return {{1, 4, 4, 2, 1, 3, true, document},{2, 7, 7, 4, 2, 5, true, dropout(0.1f)},   {1, 70, 70, 2, 1, 3, true, dropout(0.25f)},
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

// ---- the by-index mask (attention_dropout_mask) ----

// The contract's mask of a problem: the keep bit of every visible element, 0 above the causal diagonal.
std::vector<double> contract_mask(const Problem& p) {
  std::vector<double> m;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Sq; ++i)
        for (int64_t j = 0; j < p.Skv; ++j) {
          const bool visible = !p.causal || j <= i + (p.Skv - p.Sq);
          m.push_back(visible && plain_factor(p, b, h, i, j) > 0.0 ? 1.0 : 0.0);
        }
  return m;
}

std::vector<double> mask_of(Context& ctx, const Problem& p, DType dtype) {
  Tensor mask = ctx.empty({p.B, p.H, p.Sq, p.Skv}, dtype);
  poison(ctx, mask);
  ops::attention_dropout_mask(ctx, mask, p.dropout, p.causal);
  return to_doubles(ctx, mask);
}

TEST(AttentionDropoutMask, IsTheKeepBitOfEveryElement) {
  for (const Problem& p : problems()) {
    if (!p.dropout.enabled()) continue;
    SCOPED_TRACE(p.name());
    const std::vector<double> want = contract_mask(p);
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) EXPECT_EQ(mask_of(cpu_context(), p, dtype), want);
  }
}

TEST(AttentionDropoutMaskBadInput, NamesTheProblem) {
  Context& ctx = cpu_context();
  const Tensor mask = ctx.empty({1, 2, 6, 6}, DType::BF16);
  expect_error([&] { ops::attention_dropout_mask(ctx, mask, {}, true); }, {"attention_dropout_mask", "p must be > 0"});
  expect_error([&] { ops::attention_dropout_mask(ctx, ctx.empty({1, 2, 6, 6}, DType::F64), dropout(0.1f), true); },
               {"attention_dropout_mask", "mask", "f64"});
  expect_error([&] { ops::attention_dropout_mask(ctx, ctx.empty({1, 2, 7, 6}, DType::BF16), dropout(0.1f), true); },
               {"attention_dropout_mask", "Skv >= Sq"});
  ops::AttentionDropout heads = dropout(0.1f);
  heads.heads = 3;
  heads.head_offset = 2;
  expect_error([&] { ops::attention_dropout_mask(ctx, mask, heads, false); },
               {"attention_dropout_mask", "2 heads from head 2", "3 heads"});
}

// cuDNN's generator is keyed by a hash of the addressing: every change of it (another layer or micro-batch,
// another TP rank's heads, another CP block's rows) gives another stream; the same addressing the same one.
TEST(AttentionDropout, DeviceSeedsDifferWhereTheAddressingDoes) {
  ops::AttentionDropout base = dropout(0.1f);
  base.heads = 8;
  base.seq = 12;
  base.queries = ops::two_chunk_runs(2, 0, 3);
  const uint64_t seed = ops::attention_dropout_device_seed(base);
  EXPECT_EQ(ops::attention_dropout_device_seed(base), seed);
  std::set<uint64_t> seen{seed};
  const std::vector<std::function<void(ops::AttentionDropout&)>> changes = {
      [](auto& d) { d.seed += 1; },          [](auto& d) { d.offset += 1; },
      [](auto& d) { d.head_offset = 4; },    [](auto& d) { d.heads = 16; },
      [](auto& d) { d.seq = 24; },           [](auto& d) { d.queries = ops::two_chunk_runs(2, 1, 3); },
      [](auto& d) { d.keys = ops::two_chunk_runs(2, 1, 3); }, [](auto& d) { d.batch_offset = 1; }};
  for (size_t c = 0; c < changes.size(); ++c) {
    ops::AttentionDropout d = base;
    changes[c](d);
    EXPECT_TRUE(seen.insert(ops::attention_dropout_device_seed(d)).second) << "change " << c;
  }
}

// ---- GPU ----

Context& gpu() { return cuda_context(); }

Tensor upload(const Tensor& host) { return to_device(gpu(), host, gpu().device(), cpu_context().allocator()); }

TEST(AttentionDropoutGpu, ByIndexMaskIsTheCpusBitForBit) {
  MEGATRON_REQUIRE_GPU();
  std::vector<Problem> cases = problems();
  // Rows over many thread blocks, key counts that are not multiples of 4, a CP rank's two chunks of queries
  // over another rank's two chunks of keys, an odd head offset.
  ops::AttentionDropout ring = dropout(0.15f, 31);
  ring.seq = 300;
  ring.queries = ops::two_chunk_runs(2, 1, 75);
  ring.keys = ops::two_chunk_runs(2, 0, 75);
  ops::AttentionDropout heads = dropout(0.25f, 77);
  heads.heads = 7;
  heads.head_offset = 3;
  cases.push_back({2, 150, 150, 3, 3, 64, false, ring});
  cases.push_back({2, 301, 301, 4, 4, 64, true, dropout(0.1f, 12345)});
  cases.push_back({1, 97, 211, 4, 4, 64, true, heads});
  for (const Problem& p : cases) {
    if (!p.dropout.enabled()) continue;
    SCOPED_TRACE(p.name());
    for (DType dtype : {DType::F32, DType::BF16, DType::F16})
      EXPECT_EQ(mask_of(gpu(), p, dtype), mask_of(cpu_context(), p, dtype)) << dtype_name(dtype);
  }
}

// By-index dropout through cuDNN (a custom mask) against the CPU reference on the same bf16/f16 inputs: the
// masks are the same, so outputs and gradients agree to flash attention's rounding (a different mask is off
// by O(1)). Self-attention, full attention, a TP rank's heads, a CP ring's diagonal and off-diagonal blocks,
// the packed QKV layout.
OpCase by_index_case(const Problem& p, DType dtype, bool backward, bool packed = false) {
  OpCase c;
  c.name = str_cat(backward ? "bwd_" : "fwd_", packed ? "packed_" : "", dtype_name(dtype), "_", p.name());
  const double limit = dtype == DType::BF16 ? 2e-4 : 2e-6;
  AttentionOptions options = p.options();
  options.dropout.masks = ops::DropoutMasks::ByIndex;
  const Problem pp = p;
  if (packed) {
    const Shape qkv{p.B, p.Sq, p.H * 3 * p.D};
    c.inputs = {{qkv, dtype}, {p.q_shape(), dtype}};
    c.outputs = {{backward ? qkv : p.q_shape(), dtype}};
    c.max_nmse = {limit};
    c.run = [pp, options, backward, dtype](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      Tensor o = backward ? ctx.empty(pp.q_shape(), dtype) : out[0], stats = ctx.empty(pp.stats_shape(), DType::F32);
      ops::attention_forward_packed(ctx, o, stats, in[0], options);
      if (backward) ops::attention_backward_packed(ctx, out[0], in[1], in[0], o, stats, options);
    };
    return c;
  }
  c.inputs = {{p.q_shape(), dtype}, {p.kv_shape(), dtype}, {p.kv_shape(), dtype}, {p.q_shape(), dtype}};
  if (!backward) {
    c.outputs = {{p.q_shape(), dtype}, {p.stats_shape(), DType::F32}};
    c.max_nmse = {limit, 1e-8};
    c.run = [options](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      ops::attention_forward(ctx, out[0], out[1], in[0], in[1], in[2], options);
    };
    return c;
  }
  c.outputs = {{p.q_shape(), dtype}, {p.kv_shape(), dtype}, {p.kv_shape(), dtype}};
  c.max_nmse = {limit, limit, limit};
  c.run = [pp, options, dtype](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    Tensor o = ctx.empty(pp.q_shape(), dtype), stats = ctx.empty(pp.stats_shape(), DType::F32);
    ops::attention_forward(ctx, o, stats, in[0], in[1], in[2], options);
    ops::attention_backward(ctx, out[0], out[1], out[2], in[3], in[0], in[1], in[2], o, stats, options);
  };
  return c;
}

std::vector<OpCase> by_index_cases() {
  ops::AttentionDropout heads = dropout(0.2f, 3);
  heads.heads = 8;
  heads.head_offset = 4;
  ops::AttentionDropout diagonal = dropout(0.1f, 4), block = dropout(0.1f, 4);
  diagonal.seq = block.seq = 192;  // CP = 2, chunks of 48: rank 1's queries over its own and over rank 0's keys
  diagonal.queries = diagonal.keys = block.queries = ops::two_chunk_runs(2, 1, 48);
  block.keys = ops::two_chunk_runs(2, 0, 48);
  std::vector<OpCase> cases;
  for (bool backward : {false, true}) {
    for (const Problem& p : {Problem{2, 128, 128, 4, 2, 64, true, dropout(0.1f)},
                             Problem{1, 100, 100, 2, 2, 128, false, dropout(0.3f)},
                             Problem{2, 64, 64, 4, 4, 64, true, heads}, Problem{1, 96, 96, 2, 2, 64, true, diagonal},
                             Problem{1, 96, 96, 2, 1, 64, false, block}})
      cases.push_back(by_index_case(p, DType::BF16, backward));
    cases.push_back(by_index_case({1, 77, 77, 2, 2, 64, true, dropout(0.1f, 9)}, DType::F16, backward));
    cases.push_back(by_index_case({2, 64, 64, 4, 4, 64, true, dropout(0.1f, 5)}, DType::BF16, backward, true));
  }
  return cases;
}
class AttentionDropoutGpuByIndex : public ::testing::TestWithParam<OpCase> {};
TEST_P(AttentionDropoutGpuByIndex, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, AttentionDropoutGpuByIndex, ::testing::ValuesIn(by_index_cases()),
                         [](const auto& info) { return gtest_name(info.param.name); });

struct GpuRun {
  std::vector<double> out, dq, dk, dv;
};

GpuRun run_gpu(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  Context& ctx = gpu();
  const DType dt = q.dtype();
  Tensor out = ctx.empty(p.q_shape(), dt), stats = ctx.empty(p.stats_shape(), DType::F32);
  Tensor dq = ctx.empty(p.q_shape(), dt), dk = ctx.empty(p.kv_shape(), dt), dv = ctx.empty(p.kv_shape(), dt);
  ops::attention_forward(ctx, out, stats, q, k, v, p.options());
  ops::attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, stats, p.options());
  return {to_doubles(ctx, out), to_doubles(ctx, dq), to_doubles(ctx, dk), to_doubles(ctx, dv)};
}

Tensor as_f64(const Tensor& gpu_tensor) {
  const std::vector<double> values = to_doubles(gpu(), gpu_tensor);
  Tensor t = cpu_context().empty(gpu_tensor.shape(), DType::F64);
  std::copy(values.begin(), values.end(), t.data<double>());
  return t;
}

// cuDNN's own generator (the default). With V the identity over the keys (D = Skv) the output row is the row of
// P o M / (1 - p): the mask can be read off the forward. It drops the visible probabilities at rate p -- within
// five standard deviations of n / 4 draws, since cuDNN 9's masks repeat within blocks of 8 query rows (measured
// through its rng dump: rows 0, 2, 4, 6 share one pattern and 1, 3, 5, 7 another) -- scales the kept ones by
// 1 / (1 - p), gives the same bits for the same addressing and other masks for another offset or head offset,
// and its backward applies the forward's mask: gradients equal fp64 loops over the mask read off the forward.
TEST(AttentionDropoutGpu, DeviceMasksDropAtTheRateAndTheBackwardUsesTheForwardsMask) {
  MEGATRON_REQUIRE_GPU();
  const int64_t B = 2, S = 128, H = 4;
  for (bool causal : {false, true})
    for (float prob : {0.1f, 0.5f}) {
      const Problem p{B, S, S, H, H, S, causal, dropout(prob, 11)};
      SCOPED_TRACE(p.name());
      Problem plain = p;
      plain.dropout = {};
      auto random = [&](const Shape& shape, const std::string& name) {
        Tensor t = cpu_context().empty(shape, DType::BF16);
        fill_random(t, seed_from(name + p.name()));
        return upload(t);
      };
      Tensor one_hot = cpu_context().empty(p.kv_shape(), DType::BF16);
      {
        Tensor f64 = cpu_context().empty(p.kv_shape(), DType::F64);
        std::fill_n(f64.data<double>(), f64.numel(), 0.0);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < S; ++j)
            for (int64_t g = 0; g < H; ++g) f64.data<double>()[((b * S + j) * H + g) * S + j] = 1.0;
        ops::cast(cpu_context(), one_hot, f64);
      }
      const Tensor q = random(p.q_shape(), "q"), k = random(p.kv_shape(), "k"), v = upload(one_hot),
                   dout = random(p.q_shape(), "do");
      const GpuRun dropped = run_gpu(p, q, k, v, dout), whole = run_gpu(plain, q, k, v, dout);
      // The mask read off the output: out[b, i, h, j] = P[b, h, i, j] * factor.
      auto at = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return size_t(((b * S + i) * H + h) * S + j); };
      const double scale = 1.0 / (1.0 - double(prob));
      int64_t visible = 0, zeros = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < S; ++i)
            for (int64_t j = 0; j <= (causal ? i : S - 1); ++j) {
              ++visible;
              const double got = dropped.out[at(b, h, i, j)], want = whole.out[at(b, h, i, j)] * scale;
              if (got == 0.0) ++zeros;
              else EXPECT_NEAR(got, want, 2e-2 * want) << "b " << b << " h " << h << " i " << i << " j " << j;
            }
      const double n = double(visible) / 4, sigma = std::sqrt(double(prob) * (1.0 - prob) / n);
      EXPECT_NEAR(double(zeros) / double(visible), double(prob), 5 * sigma) << zeros << " of " << visible;
      // The backward against fp64 loops over that mask.
      const Plain want = plain_attention(p, as_f64(q), as_f64(k), as_f64(v), as_f64(dout),
                                         [&](int64_t b, int64_t h, int64_t i, int64_t j) {
                                           return dropped.out[at(b, h, i, j)] != 0.0 ? scale : 0.0;
                                         });
      EXPECT_LE(nmse(dropped.dq, want.dq), 2e-4);
      EXPECT_LE(nmse(dropped.dk, want.dk), 2e-4);
      EXPECT_LE(nmse(dropped.dv, want.dv), 2e-4);
      // The same addressing repeats its masks; another offset or another TP rank's heads draw others.
      EXPECT_EQ(run_gpu(p, q, k, v, dout).out, dropped.out);
      for (auto change : {+[](Problem& x) { x.dropout.offset += 1; },
                          +[](Problem& x) { x.dropout.heads = 2 * x.H, x.dropout.head_offset = x.H; }}) {
        Problem other = p;
        change(other);
        EXPECT_GT(max_abs_diff(run_gpu(other, q, k, v, dout).out, dropped.out), 1e-3);
      }
    }
}

TEST(AttentionDropoutGpu, RefusedWhereCudnnHasNoDropout) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = gpu();
  for (ops::DropoutMasks masks : {ops::DropoutMasks::Device, ops::DropoutMasks::ByIndex}) {
    Problem bottom_right{1, 8, 16, 2, 2, 64, true, dropout(0.1f)};
    bottom_right.dropout.masks = masks;
    Tensor q = ctx.empty(bottom_right.q_shape(), DType::BF16), k = ctx.empty(bottom_right.kv_shape(), DType::BF16);
    Tensor out = ctx.empty(bottom_right.q_shape(), DType::BF16), stats = ctx.empty(bottom_right.stats_shape(), DType::F32);
    expect_error([&] { ops::attention_forward(ctx, out, stats, q, k, k, bottom_right.options()); },
                 {"attention_forward", "Sq = 8 < Skv = 16", "--cp-comm-type p2p or a2a"});
    Problem one_key{1, 4, 1, 2, 2, 64, false, dropout(0.1f)};
    one_key.dropout.masks = masks;
    one_key.dropout.seq = 4;  // the queries' positions 0..3 and the one key at position 0 of P
    one_key.dropout.keys = {{0, 0, 1}};
    Tensor k1 = ctx.empty(one_key.kv_shape(), DType::BF16), q4 = ctx.empty(one_key.q_shape(), DType::BF16);
    Tensor out4 = ctx.empty(one_key.q_shape(), DType::BF16), stats4 = ctx.empty(one_key.stats_shape(), DType::F32);
    expect_error([&] { ops::attention_forward(ctx, out4, stats4, q4, k1, k1, one_key.options()); },
                 {"attention_forward", "single key"});
  }
}

}  // namespace
}  // namespace megatron
