// grouped_gemm family: the CPU path against plain loops; finite differences of the forward through the
// input and weight gradients (fp64); CUDA (one grouped launch, and one GEMM per expert) vs CPU over forward,
// input gradient and weight gradient, f32 and bf16, into the input dtype and into f32, with random counts
// including zeros, one expert holding every row, E = 1, every expert empty, more experts than one grouped
// launch takes, odd and aligned N / K, accumulation on and off; rows past the counts untouched; bad input.
//
// Thresholds (normalised squared error) beyond the per-dtype defaults: bf16 inputs into an f32 output differ
// only in fp32 summation order on the two sides: kNarrowToF32 = 1e-9 (as in test_gemm).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "harness.h"
#include "megatron/ops/grouped_gemm/grouped_gemm.h"

namespace megatron {
namespace {

using namespace megatron::testing;
using enum DType;
using ops::GroupedGemmAlgo;

constexpr double kNarrowToF32 = 1e-9;

enum class Kind { Forward, InputGrad, WeightGrad };
const char* kind_name(Kind k) { return k == Kind::Forward ? "fwd" : k == Kind::InputGrad ? "dgrad" : "wgrad"; }

struct Problem {
  std::string name;
  int64_t n, k;  // w is [E, n, k]
  std::vector<int64_t> counts;
  int64_t experts() const { return int64_t(counts.size()); }
  int64_t rows() const { return std::accumulate(counts.begin(), counts.end(), int64_t(0)); }
};

// Counts with zeros from a fixed pattern: expert e gets (e * 7919 + salt) % (2 * mean + 1) rows, every third
// expert none.
std::vector<int64_t> spread_counts(int64_t experts, int64_t mean, int64_t salt) {
  std::vector<int64_t> c;
  for (int64_t e = 0; e < experts; ++e) c.push_back(e % 3 == 1 ? 0 : (e * 7919 + salt) % (2 * mean + 1));
  return c;
}

const Problem kProblems[] = {
    {"random_counts_with_zeros_N13_K7", 13, 7, {7, 0, 13, 1, 0}},
    {"one_expert_holds_all_N24_K40", 24, 40, {0, 0, 37, 0}},
    {"E1_N129_K65", 129, 65, {29}},
    {"every_expert_empty_N8_K16", 8, 16, {0, 0, 0}},
    {"aligned_N64_K128", 64, 128, {16, 48, 0, 33, 64, 1, 8, 30}},
    {"E130_more_than_one_launch_N16_K24", 16, 24, spread_counts(130, 2, 5)},  // aligned: bf16 groups too
    {"odd_N1_K3", 1, 3, {4, 5, 0}},
};

// The operand shapes of one call: (d, a, b) as passed to the op.
struct Shapes {
  Shape d, a, b;
};
Shapes shapes_of(const Problem& p, Kind kind) {
  const int64_t E = p.experts(), R = p.rows();
  switch (kind) {
    case Kind::Forward: return {{R, p.n}, {R, p.k}, {E, p.n, p.k}};
    case Kind::InputGrad: return {{R, p.k}, {R, p.n}, {E, p.n, p.k}};
    case Kind::WeightGrad: return {{E, p.n, p.k}, {R, p.n}, {R, p.k}};
  }
  return {};
}

void run_op(Context& ctx, Kind kind, const Tensor& d, const Tensor& a, const Tensor& b,
            const std::vector<int64_t>& counts, bool accumulate, GroupedGemmAlgo algo) {
  if (kind == Kind::WeightGrad) ops::grouped_gemm_wgrad(ctx, d, a, b, counts, accumulate, {.algo = algo});
  else ops::grouped_gemm(ctx, d, a, b, counts, {.transpose_w = kind == Kind::Forward, .algo = algo});
}

// ---- the CPU path vs plain loops ----

// The expected (d) in double from the inputs' values: out_e = x_e w_e^T / x_e w_e, dw_e (+)= dy_e^T x_e.
std::vector<double> plain_loops(const Problem& p, Kind kind, const std::vector<double>& a,
                                const std::vector<double>& b, std::vector<double> d, bool accumulate) {
  int64_t row0 = 0;
  for (int64_t e = 0; e < p.experts(); ++e) {
    const int64_t m = p.counts[size_t(e)];
    const double* w = (kind == Kind::WeightGrad ? nullptr : b.data() + e * p.n * p.k);
    if (kind == Kind::Forward)
      for (int64_t r = row0; r < row0 + m; ++r)
        for (int64_t j = 0; j < p.n; ++j) {
          double s = 0;
          for (int64_t c = 0; c < p.k; ++c) s += a[size_t(r * p.k + c)] * w[j * p.k + c];
          d[size_t(r * p.n + j)] = s;
        }
    if (kind == Kind::InputGrad)
      for (int64_t r = row0; r < row0 + m; ++r)
        for (int64_t c = 0; c < p.k; ++c) {
          double s = 0;
          for (int64_t j = 0; j < p.n; ++j) s += a[size_t(r * p.n + j)] * w[j * p.k + c];
          d[size_t(r * p.k + c)] = s;
        }
    if (kind == Kind::WeightGrad)
      for (int64_t j = 0; j < p.n; ++j)
        for (int64_t c = 0; c < p.k; ++c) {
          double s = 0;
          for (int64_t r = row0; r < row0 + m; ++r) s += a[size_t(r * p.n + j)] * b[size_t(r * p.k + c)];
          double& out = d[size_t((e * p.n + j) * p.k + c)];
          out = accumulate ? out + s : s;
        }
    row0 += m;
  }
  return d;
}

TEST(GroupedGemmCpu, MatchesPlainLoops) {
  Context& ctx = cpu_context();
  for (const Problem& p : kProblems)
    for (Kind kind : {Kind::Forward, Kind::InputGrad, Kind::WeightGrad})
      for (auto [in, out] : {std::pair{F64, F64}, std::pair{F32, F32}, std::pair{BF16, F32}, std::pair{BF16, BF16}})
        for (bool accumulate : {false, true}) {
          if (accumulate && kind != Kind::WeightGrad) continue;
          const std::string what = str_cat(p.name, " ", kind_name(kind), " ", in, "->", out, accumulate ? " +=" : "");
          const Shapes s = shapes_of(p, kind);
          Tensor a = ctx.empty(s.a, in), b = ctx.empty(s.b, in), d = ctx.empty(s.d, out);
          fill_random(a, seed_from(what + "a"));
          fill_random(b, seed_from(what + "b"));
          fill_random(d, seed_from(what + "d"));
          const std::vector<double> want =
              plain_loops(p, kind, to_doubles(ctx, a), to_doubles(ctx, b), to_doubles(ctx, d), accumulate);
          run_op(ctx, kind, d, a, b, p.counts, accumulate, GroupedGemmAlgo::Grouped);
          const double limit = out == F64 ? 1e-24 : out == F32 ? 1e-11 : default_max_nmse(out);
          EXPECT_LE(nmse(to_doubles(ctx, d), want), limit) << what;
        }
}

// Rows past the counts' sum are not written (the tail of a dropless permute's T * k rows).
void expect_tail_untouched(Context& ctx, GroupedGemmAlgo algo) {
  const std::vector<int64_t> counts{3, 0, 5};
  const int64_t R = 12, N = 16, K = 8;
  Tensor x = ctx.empty({R, K}, BF16), w = ctx.empty({3, N, K}, BF16), out_host = cpu_context().empty({R, N}, BF16);
  Tensor xh = cpu_context().empty({R, K}, BF16), wh = cpu_context().empty({3, N, K}, BF16);
  fill_random(xh, 1);
  fill_random(wh, 2);
  fill_random(out_host, 3);
  copy_tensor(ctx, x, xh);
  copy_tensor(ctx, w, wh);
  Tensor out = ctx.empty({R, N}, BF16);
  copy_tensor(ctx, out, out_host);
  ops::grouped_gemm(ctx, out, x, w, counts, {.algo = algo});
  const std::vector<double> got = to_doubles(ctx, out), before = to_doubles(cpu_context(), out_host);
  for (int64_t i = 8 * N; i < R * N; ++i) EXPECT_EQ(got[size_t(i)], before[size_t(i)]) << "element " << i;
}

TEST(GroupedGemmCpu, RowsPastTheCountsAreUntouched) { expect_tail_untouched(cpu_context(), GroupedGemmAlgo::Grouped); }

// ---- finite differences (fp64): the forward's gradients are the dgrad and wgrad calls ----

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> out;
  for (const Problem& p : {Problem{"zeros", 5, 4, {3, 0, 4, 2}}, Problem{"one", 3, 6, {0, 7}}}) {
    GradCase c;
    c.name = p.name;
    c.inputs = {TensorSpec{{p.rows(), p.k}, F64}, TensorSpec{{p.experts(), p.n, p.k}, F64}};
    c.differentiable = {0, 1};
    c.forward = [p](Context& ctx, const std::vector<Tensor>& in) {
      Tensor y = ctx.empty({p.rows(), p.n}, F64);
      ops::grouped_gemm(ctx, y, in[0], in[1], p.counts);
      return std::vector<Tensor>{y};
    };
    c.backward = [p](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
      Tensor dx = ctx.empty(in[0].shape(), F64), dw = ctx.empty(in[1].shape(), F64);
      ops::grouped_gemm(ctx, dx, g[0], in[1], p.counts, {.transpose_w = false});
      ops::grouped_gemm_wgrad(ctx, dw, g[0], in[0], p.counts, false);
      return std::vector<Tensor>{dx, dw};
    };
    out.push_back(c);
  }
  return out;
}

MEGATRON_GRAD_CASES(GroupedGemm, grad_cases);

// ---- CUDA vs CPU ----

OpCase make_case(const Problem& p, Kind kind, DType in, DType out, bool accumulate, GroupedGemmAlgo algo) {
  const Shapes s = shapes_of(p, kind);
  OpCase c;
  c.name = str_cat(kind_name(kind), "_", p.name, "_", in, "_to_", out, accumulate ? "_accumulate_" : "_",
                   ops::grouped_gemm_algo_name(algo));
  c.inputs = {{s.a, in}, {s.b, in}};
  c.outputs = {{s.d, out}};
  if (accumulate) {
    c.inputs.push_back({s.d, out});
    c.output_starts_as_input = {{0, 2}};
  }
  c.max_nmse = {in != out ? kNarrowToF32 : 0.0};
  c.run = [p, kind, accumulate, algo](Context& ctx, const std::vector<Tensor>& i, const std::vector<Tensor>& o) {
    run_op(ctx, kind, o[0], i[0], i[1], p.counts, accumulate, algo);
  };
  return c;
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  for (const Problem& p : kProblems)
    for (GroupedGemmAlgo algo : {GroupedGemmAlgo::Grouped, GroupedGemmAlgo::PerExpert})
      for (auto [in, out] : {std::pair{F32, F32}, std::pair{BF16, BF16}, std::pair{BF16, F32}}) {
        for (Kind kind : {Kind::Forward, Kind::InputGrad}) cases.push_back(make_case(p, kind, in, out, false, algo));
        for (bool accumulate : {false, true}) cases.push_back(make_case(p, Kind::WeightGrad, in, out, accumulate, algo));
      }
  return cases;
}

MEGATRON_OP_CASES(GroupedGemm, op_cases);

// ---- bad input ----

TEST(GroupedGemmBadInput, CountsShapesAndDtypes) {
  Context& ctx = cpu_context();
  Tensor x = ctx.empty({10, 4}, BF16), w = ctx.empty({3, 6, 4}, BF16), out = ctx.empty({10, 6}, BF16);
  const std::vector<int64_t> good{3, 3, 4};
  expect_error([&] { ops::grouped_gemm(ctx, out, x, w, std::vector<int64_t>{3, 7}); },
               {"grouped_gemm", "counts has 2 entries for 3 experts"});
  expect_error([&] { ops::grouped_gemm(ctx, out, x, w, std::vector<int64_t>{3, -1, 4}); },
               {"grouped_gemm", "counts[1] = -1"});
  expect_error([&] { ops::grouped_gemm(ctx, out, x, w, std::vector<int64_t>{3, 5, 4}); },
               {"grouped_gemm", "more than the 10 rows", "after expert 2"});
  expect_error([&] { ops::grouped_gemm(ctx, out, ctx.empty({10, 6}, BF16), w, good); },
               {"grouped_gemm", "must have 4 columns", "x_e w_e^T"});
  expect_error([&] { ops::grouped_gemm(ctx, ctx.empty({10, 6}, BF16), x, w, good, {.transpose_w = false}); },
               {"grouped_gemm", "must have 6 columns", "x_e w_e)"});
  expect_error([&] { ops::grouped_gemm(ctx, ctx.empty({9, 6}, BF16), x, w, good); }, {"grouped_gemm", "out", "[10, 6]"});
  expect_error([&] { ops::grouped_gemm(ctx, out, x, ctx.empty({3, 6, 4}, F32), good); }, {"grouped_gemm", "x", "w"});
  expect_error([&] { ops::grouped_gemm(ctx, ctx.empty({10, 6}, F16), x, w, good); }, {"grouped_gemm", "out", "f16"});
  expect_error([&] { ops::grouped_gemm(ctx, out, x, ctx.empty({6, 4}, BF16), good); }, {"grouped_gemm", "w", "rank 3"});
  Tensor dw = ctx.empty({3, 6, 4}, F32), dy = ctx.empty({10, 6}, BF16);
  expect_error([&] { ops::grouped_gemm_wgrad(ctx, dw, dy, ctx.empty({10, 5}, BF16), good, true); },
               {"grouped_gemm_wgrad", "x", "[10, 4]"});
  expect_error([&] { ops::grouped_gemm_wgrad(ctx, dw, dy, ctx.empty({9, 4}, BF16), good, true); },
               {"grouped_gemm_wgrad", "x", "[10, 4]"});
  expect_error([&] { ops::grouped_gemm_wgrad(ctx, ctx.empty({3, 6, 4}, F16), dy, x, good, true); },
               {"grouped_gemm_wgrad", "dw", "f16"});
  expect_error([&] { ops::grouped_gemm_wgrad(ctx, ctx.empty({2, 6, 4}, F32), dy, x, good, true); },
               {"grouped_gemm_wgrad", "3 entries for 2 experts"});
}

// ---- GPU only ----

TEST(GroupedGemmGpu, RowsPastTheCountsAreUntouched) {
  MEGATRON_REQUIRE_GPU();
  for (GroupedGemmAlgo algo : {GroupedGemmAlgo::Grouped, GroupedGemmAlgo::PerExpert})
    expect_tail_untouched(cuda_context(), algo);
}

// Expert-MLP-shaped problems (skewed and even counts over 8 experts, SwiGLU's doubled fc1 width), both
// algorithms, every kind, bf16 with bf16 outputs and the f32 main-grad wgrad.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> cases;
  const Problem skewed{"E8_skewed_fc1_N2816_K1024", 2816, 1024, {1500, 10, 0, 700, 300, 1, 2000, 585}};
  const Problem even{"E8_even_fc2_N1024_K1408", 1024, 1408, std::vector<int64_t>(8, 640)};
  for (const Problem& p : {skewed, even})
    for (GroupedGemmAlgo algo : {GroupedGemmAlgo::Grouped, GroupedGemmAlgo::PerExpert}) {
      cases.push_back(make_case(p, Kind::Forward, BF16, BF16, false, algo));
      cases.push_back(make_case(p, Kind::InputGrad, BF16, BF16, false, algo));
      cases.push_back(make_case(p, Kind::WeightGrad, BF16, F32, true, algo));
      cases.push_back(make_case(p, Kind::WeightGrad, BF16, BF16, false, algo));
    }
  return cases;
}

class GroupedGemmGpuLarge : public ::testing::TestWithParam<OpCase> {};
TEST_P(GroupedGemmGpuLarge, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, GroupedGemmGpuLarge, ::testing::ValuesIn(large_cases()),
                         [](const auto& info) { return gtest_name(info.param.name); });

// Repeated calls whose counts change (nothing about the counts may be cached): both algorithms against the
// CPU on every call.
TEST(GroupedGemmGpu, ChangingCountsBetweenCalls) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = cuda_context();
  const int64_t R = 2000, N = 96, K = 80, E = 6;
  Tensor xh = cpu_context().empty({R, K}, BF16), wh = cpu_context().empty({E, N, K}, BF16);
  fill_random(xh, 1);
  fill_random(wh, 2);
  Tensor x = gpu.empty({R, K}, BF16), w = gpu.empty({E, N, K}, BF16);
  copy_tensor(gpu, x, xh);
  copy_tensor(gpu, w, wh);
  for (int call = 0; call < 5; ++call) {
    std::vector<int64_t> counts = spread_counts(E, 100 + 10 * call, call);
    counts[0] += R - std::accumulate(counts.begin(), counts.end(), int64_t(0));
    // BF16 out, aligned N and K: the grouped launch itself runs (an F32 out would go per expert).
    Tensor grouped = gpu.empty({R, N}, BF16), per_expert = gpu.empty({R, N}, BF16);
    Tensor ref = cpu_context().empty({R, N}, BF16);
    ops::grouped_gemm(gpu, grouped, x, w, counts, {.algo = GroupedGemmAlgo::Grouped});
    ops::grouped_gemm(gpu, per_expert, x, w, counts, {.algo = GroupedGemmAlgo::PerExpert});
    ops::grouped_gemm(cpu_context(), ref, xh, wh, counts);
    const std::vector<double> want = to_doubles(cpu_context(), ref);
    EXPECT_LE(nmse(to_doubles(gpu, grouped), want), default_max_nmse(BF16)) << "call " << call;
    EXPECT_LE(nmse(to_doubles(gpu, per_expert), want), default_max_nmse(BF16)) << "call " << call;
  }
}

// The per-expert path picks an algorithm per family of shapes (rows rounded up to a power of two) on the
// first problem of the family, timing candidates; for an accumulating weight gradient that timing must not
// add into the gradient. Counts that grow from call to call open new families at later calls, between real
// accumulations: the F32 main grad accumulated over all calls equals the CPU's.
TEST(GroupedGemmGpu, MainGradAccumulatesOnceWhileNewShapeFamiliesAreTimed) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = cuda_context();
  Context& cpu = cpu_context();
  const int64_t E = 4, N = 136, K = 72;  // a shape no other test uses, so its families start here
  Tensor dw_gpu = gpu.empty({E, N, K}, F32), dw_cpu = cpu.empty({E, N, K}, F32);
  fill_random(dw_cpu, 3);
  copy_tensor(gpu, dw_gpu, dw_cpu);
  for (int call = 0; call < 4; ++call) {
    const int64_t per_expert = int64_t(24) << (2 * call);  // 24, 96, 384, 1536 rows: a new family each call
    const std::vector<int64_t> counts{per_expert, per_expert / 3, 0, per_expert + 5};
    const int64_t R = std::accumulate(counts.begin(), counts.end(), int64_t(0));
    Tensor dyh = cpu.empty({R, N}, BF16), xh = cpu.empty({R, K}, BF16);
    fill_random(dyh, 10 + call);
    fill_random(xh, 20 + call);
    Tensor dy = gpu.empty(dyh.shape(), BF16), x = gpu.empty(xh.shape(), BF16);
    copy_tensor(gpu, dy, dyh);
    copy_tensor(gpu, x, xh);
    ops::grouped_gemm_wgrad(gpu, dw_gpu, dy, x, counts, /*accumulate=*/true, {.algo = GroupedGemmAlgo::PerExpert});
    ops::grouped_gemm_wgrad(cpu, dw_cpu, dyh, xh, counts, /*accumulate=*/true);
    EXPECT_LE(nmse(to_doubles(gpu, dw_gpu), to_doubles(cpu, dw_cpu)), kNarrowToF32) << "call " << call;
  }
}

}  // namespace
}  // namespace megatron
