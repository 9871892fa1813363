// Elementwise family: CUDA vs the CPU reference on every dtype and odd shapes (exact where the contract
// says bit-identical), independent properties of the CPU reference, and argument validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "harness.h"
#include "megatron/core/philox.h"
#include "megatron/ops/elementwise/elementwise.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::OpCase;
using testing::TensorSpec;
using enum DType;

constexpr double kExact = 1e-300;  // nmse threshold that only identical values pass
constexpr double kSum = 1e-9;      // fp32 accumulation (CUDA) vs fp64 (CPU)

const DType kFloats[] = {F32, F16, BF16, F8E4M3, F8E5M2, F64};
const DType kArith[] = {F32, F16, BF16, F64};
const DType kInts[] = {I8, I16, I32, I64, U8, U16};

using RunFn = std::function<void(Context&, const std::vector<Tensor>&, const std::vector<Tensor>&)>;
OpCase make_case(std::string name, std::vector<TensorSpec> inputs, std::vector<TensorSpec> outputs, RunFn run,
                 std::vector<double> max_nmse = {}, std::vector<std::pair<int, int>> starts = {}) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = std::move(inputs);
  c.outputs = std::move(outputs);
  c.run = std::move(run);
  c.max_nmse = std::move(max_nmse);
  c.output_starts_as_input = std::move(starts);
  return c;
}

std::string shape_name(const Shape& s) {
  std::ostringstream os;
  for (int i = 0; i < s.rank(); ++i) os << (i ? "x" : "") << s[i];
  return os.str();
}

// Integer ranges for int -> f32 (within the type) and f32 -> int (beyond it, to exercise saturation).
std::pair<double, double> int_range(DType t, bool beyond) {
  switch (t) {
    case I8: return beyond ? std::pair{-300.0, 300.0} : std::pair{-128.0, 128.0};
    case U8: return beyond ? std::pair{-50.0, 300.0} : std::pair{0.0, 256.0};
    case I16: return beyond ? std::pair{-4e4, 4e4} : std::pair{-32768.0, 32768.0};
    case U16: return beyond ? std::pair{-1e3, 7e4} : std::pair{0.0, 65536.0};
    case I32: return beyond ? std::pair{-3e9, 3e9} : std::pair{-2e9, 2e9};
    default: return beyond ? std::pair{-1e19, 1e19} : std::pair{-1e15, 1e15};
  }
}

std::vector<OpCase> cast_cases() {
  std::vector<OpCase> cases;
  auto run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    ops::cast(ctx, out[0], in[0]);
  };
  for (DType a : kFloats)
    for (DType b : kFloats)
      cases.push_back(make_case(str_cat("cast_", a, "_to_", b), {{Shape{33, 129}, a, -600, 600}}, {{Shape{33, 129}, b}}, run,
                       {kExact}));
  // fp8 subnormal and saturation ranges, odd sizes.
  for (DType b : {F8E4M3, F8E5M2, F16, BF16}) {
    cases.push_back(make_case(str_cat("cast_f32_to_", b, "_tiny_4097"), {{Shape{4097}, F32, -0.02, 0.02}}, {{Shape{4097}, b}}, run, {kExact}));
    cases.push_back(make_case(str_cat("cast_f32_to_", b, "_subnormal_7"), {{Shape{7}, F32, -1e-4, 1e-4}}, {{Shape{7}, b}}, run, {kExact}));
    cases.push_back(make_case(str_cat("cast_f32_to_", b, "_huge_1000"), {{Shape{1000}, F32, -7e4, 7e4}}, {{Shape{1000}, b}}, run, {kExact}));
    cases.push_back(make_case(str_cat("cast_bf16_to_", b, "_1"), {{Shape{1}, BF16, -3, 3}}, {{Shape{1}, b}}, run, {kExact}));
  }
  for (DType t : kInts) {
    auto [lo, hi] = int_range(t, false);
    cases.push_back(make_case(str_cat("cast_", t, "_to_f32"), {{Shape{7, 1001}, t, lo, hi}}, {{Shape{7, 1001}, F32}}, run, {kExact}));
    auto [lo2, hi2] = int_range(t, true);
    cases.push_back(make_case(str_cat("cast_f32_to_", t), {{Shape{7, 1001}, F32, lo2, hi2}}, {{Shape{7, 1001}, t}}, run));
    cases.push_back(make_case(str_cat("cast_f32_to_", t, "_odd"), {{Shape{129}, F32, lo2, hi2}}, {{Shape{129}, t}}, run));
  }
  // In place between equal-size types.
  cases.push_back(make_case("cast_f16_to_bf16_in_place", {{Shape{1000, 7}, F16, -3, 3}}, {{Shape{1000, 7}, F16}},
                   [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                     Tensor as_bf16 = Tensor::from_blob(out[0].data_ptr(), out[0].shape(), BF16, out[0].device());
                     ops::cast(ctx, as_bf16, out[0]);  // f16 -> bf16 over the same bytes
                     ops::cast(ctx, out[0], as_bf16);  // and back: the compared output is f16
                   },
                   {kExact}, {{0, 0}}));
  return cases;
}
MEGATRON_OP_CASES(ElementwiseCast, cast_cases);

std::vector<OpCase> cast_scaled_cases() {
  std::vector<OpCase> cases;
  for (DType a : kArith)
    for (DType b : {F8E4M3, F8E5M2, BF16, F32})
      for (Shape s : {Shape{1}, Shape{7, 129}, Shape{4097}}) {
        cases.push_back(make_case(str_cat("cast_scaled_", a, "_to_", b, "_", shape_name(s)),
                         {{s, a, -20, 20}},
                         {{s, b}, {Shape{1}, F32}},
                         [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                           ops::cast_scaled(ctx, out[0], out[1], in[0], 37.5f);
                         },
                         {kExact, kExact}));
      }
  return cases;
}
MEGATRON_OP_CASES(ElementwiseCastScaled, cast_scaled_cases);

std::vector<OpCase> fill_cases() {
  std::vector<OpCase> cases;
  for (DType t : kAllDTypes) {
    for (double v : {-3.7, 1e10}) {
      cases.push_back(make_case(str_cat("fill_", t, "_", v < 0 ? "neg" : "big"), {}, {{Shape{7, 129}, t}},
                       [v](Context& ctx, const std::vector<Tensor>&, const std::vector<Tensor>& out) {
                         ops::fill(ctx, out[0], v);
                       },
                       {kExact}));
    }
    cases.push_back(make_case(str_cat("copy_", t), {{Shape{3, 1001}, t, -50, 50}}, {{Shape{3, 1001}, t}},
                     [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                       ops::copy(ctx, out[0], in[0]);
                     },
                     {kExact}));
  }
  for (DType t : kFloats) {
    for (Shape s : {Shape{1}, Shape{7, 129}, Shape{4097}}) {
      for (uint64_t base : {uint64_t(0), uint64_t(5), uint64_t(1) << 33}) {
        std::string suffix = str_cat(t, "_", shape_name(s), "_base", base);
        cases.push_back(make_case("fill_uniform_" + suffix, {}, {{s, t}},
                         [base](Context& ctx, const std::vector<Tensor>&, const std::vector<Tensor>& out) {
                           ops::fill_uniform(ctx, out[0], 1234, 7, -2.0, 3.0, base);
                         },
                         {kExact}));
        double normal_nmse = (t == F32 || t == F64) ? 1e-12 : 0;  // 0: the dtype's default
        cases.push_back(make_case("fill_normal_" + suffix, {}, {{s, t}},
                         [base](Context& ctx, const std::vector<Tensor>&, const std::vector<Tensor>& out) {
                           ops::fill_normal(ctx, out[0], 99, 3, 0.5, 0.02, base);
                         },
                         {normal_nmse}));
      }
    }
  }
  return cases;
}
MEGATRON_OP_CASES(ElementwiseFill, fill_cases);

std::vector<OpCase> transpose_cases() {
  std::vector<OpCase> cases;
  for (DType t : {F32, BF16, F8E4M3, F64, I32}) {
    for (Shape s : {Shape{1, 1}, Shape{7, 129}, Shape{129, 1}, Shape{3, 33, 65}, Shape{2, 1000, 7}, Shape{1, 64, 96}}) {
      Shape o = s.rank() == 2 ? Shape{s[1], s[0]} : Shape{s[0], s[2], s[1]};
      cases.push_back(make_case(str_cat("transpose_", t, "_", shape_name(s)), {{s, t, -100, 100}}, {{o, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::transpose(ctx, out[0], in[0]);
                       },
                       {kExact}));
    }
  }
  return cases;
}
MEGATRON_OP_CASES(ElementwiseTranspose, transpose_cases);

std::vector<OpCase> arith_cases() {
  std::vector<OpCase> cases;
  for (DType t : kArith) {
    for (Shape s : {Shape{1}, Shape{7}, Shape{129, 33}, Shape{4097}, Shape{1000, 129}}) {
      std::string suffix = str_cat(t, "_", shape_name(s));
      std::vector<TensorSpec> two = {{s, t}, {s, t}};
      cases.push_back(make_case("add_" + suffix, two, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::add(ctx, out[0], in[0], in[1]);
                       }));
      cases.push_back(make_case("mul_" + suffix, two, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::mul(ctx, out[0], in[0], in[1]);
                       }));
      cases.push_back(make_case("scale_" + suffix, {{s, t}}, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::scale(ctx, out[0], in[0], -1.75);
                       }));
      cases.push_back(make_case("axpby_" + suffix, two, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::axpby(ctx, out[0], in[0], in[1], 0.3, -2.5);
                       }));
      // out aliases an input: out starts as a copy of a, then out = out + b / out = 0.5*b + 2*out.
      cases.push_back(make_case("add_in_place_" + suffix, two, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::add(ctx, out[0], out[0], in[1]);
                       },
                       {}, {{0, 0}}));
      cases.push_back(make_case("axpby_in_place_" + suffix, two, {{s, t}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::axpby(ctx, out[0], in[1], out[0], 0.5, 2.0);
                       },
                       {}, {{0, 0}}));
    }
  }
  // scale_rows: a per-row gate (F32, F64 for F64 tensors), also in place. CUDA rounds the fp32 product of a
  // narrow value and an F32 gate twice, the CPU once: an ulp apart at most.
  for (DType t : kArith) {
    for (Shape s : {Shape{1, 1}, Shape{7, 3}, Shape{129, 33}, Shape{3, 5, 17}}) {
      const DType gate = t == F64 ? F64 : F32;
      const std::string suffix = str_cat(t, "_", shape_name(s));
      const Shape rows{s.rows()};
      cases.push_back(make_case("scale_rows_" + suffix, {{s, t}, {rows, gate}}, {{s, t}},
                                [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                                  ops::scale_rows(ctx, out[0], in[0], in[1]);
                                },
                                {t == F32 || t == F64 ? kExact : kSum}));
      cases.push_back(make_case("scale_rows_in_place_" + suffix, {{s, t}, {rows, gate}}, {{s, t}},
                                [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                                  ops::scale_rows(ctx, out[0], out[0], in[1]);
                                },
                                {t == F32 || t == F64 ? kExact : kSum}, {{0, 0}}));
    }
  }
  return cases;
}
MEGATRON_OP_CASES(ElementwiseArith, arith_cases);

TEST(ElementwiseScaleRows, EachRowTimesItsGate) {
  Context& ctx = testing::cpu_context();
  Tensor in = ctx.empty(Shape{3, 4}, F32), s = ctx.empty(Shape{3}, F32), out = ctx.empty(Shape{3, 4}, F32);
  for (int i = 0; i < 12; ++i) in.data<float>()[i] = float(i) - 5.5f;
  const float gates[] = {0.5f, -2.0f, 0.0f};
  std::copy(gates, gates + 3, s.data<float>());
  ops::scale_rows(ctx, out, in, s);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out.data<float>()[i], (float(i) - 5.5f) * gates[i / 4]) << i;
  testing::expect_error([&] { ops::scale_rows(ctx, out, in, ctx.empty(Shape{4}, F32)); },
                        {"scale_rows", "argument s", "must have shape [3]"});
  testing::expect_error([&] { ops::scale_rows(ctx, out, in, ctx.empty(Shape{3}, F64)); }, {"scale_rows", "s"});
}

std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> cases;
  for (DType t : kArith) {
    for (Shape s : {Shape{1, 1}, Shape{7, 129}, Shape{129, 7}, Shape{1000, 1024}, Shape{3, 4097}, Shape{5, 8192},
                    Shape{2048, 256}, Shape{3000, 130}, Shape{129, 4096}}) {
      std::string suffix = str_cat(t, "_", shape_name(s));
      cases.push_back(make_case("sum_rows_" + suffix, {{s, t}}, {{Shape{s[0]}, F32}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::sum_rows(ctx, out[0], in[0]);
                       },
                       {kSum}));
      cases.push_back(make_case("sum_columns_" + suffix, {{s, t}}, {{Shape{s[1]}, F32}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::sum_columns(ctx, out[0], in[0]);
                       },
                       {kSum}));
    }
    for (Shape s : {Shape{1}, Shape{7, 129}, Shape{1000, 1025}, Shape{4097}}) {
      cases.push_back(make_case(str_cat("sum_all_", t, "_", shape_name(s)), {{s, t, -1, 3}}, {{Shape{1}, F32}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::sum_all(ctx, out[0], in[0]);
                       },
                       {kSum}));
    }
  }
  for (DType t : kFloats) {
    for (Shape s : {Shape{1}, Shape{7, 129}, Shape{1000, 1025}}) {
      cases.push_back(make_case(str_cat("amax_", t, "_", shape_name(s)), {{s, t, -300, 200}}, {{Shape{1}, F32}},
                       [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                         ops::amax(ctx, out[0], in[0]);
                       },
                       {kExact}));
    }
  }
  return cases;
}
MEGATRON_OP_CASES(ElementwiseReduce, reduction_cases);

// Sizes of a training step, GPU only (the CPU reference is too slow for CI at this scale).
std::vector<OpCase> large_cases() {
  std::vector<OpCase> cases;
  auto one = [](auto fn) {
    return [fn](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) { fn(ctx, in, out); };
  };
  cases.push_back(make_case("sum_columns_bf16_16384x4096", {{Shape{16384, 4096}, BF16}}, {{Shape{4096}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::sum_columns(ctx, out[0], in[0]); }), {kSum}));
  cases.push_back(make_case("sum_columns_f32_16384x4100", {{Shape{16384, 4100}, F32}}, {{Shape{4100}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::sum_columns(ctx, out[0], in[0]); }), {kSum}));
  cases.push_back(make_case("sum_rows_bf16_4096x16384", {{Shape{4096, 16384}, BF16}}, {{Shape{4096}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::sum_rows(ctx, out[0], in[0]); }), {kSum}));
  cases.push_back(make_case("sum_all_f32_16M", {{Shape{int64_t(1) << 24}, F32, 0, 1}}, {{Shape{1}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::sum_all(ctx, out[0], in[0]); }), {kSum}));
  cases.push_back(make_case("amax_bf16_16M", {{Shape{int64_t(1) << 24}, BF16, -5, 5}}, {{Shape{1}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::amax(ctx, out[0], in[0]); }), {kExact}));
  cases.push_back(make_case("transpose_bf16_4x1024x2049", {{Shape{4, 1024, 2049}, BF16}}, {{Shape{4, 2049, 1024}, BF16}},
                   one([](Context& ctx, auto& in, auto& out) { ops::transpose(ctx, out[0], in[0]); }), {kExact}));
  cases.push_back(make_case("cast_f32_to_e4m3_16M", {{Shape{int64_t(1) << 24}, F32, -500, 500}}, {{Shape{int64_t(1) << 24}, F8E4M3}},
                   one([](Context& ctx, auto& in, auto& out) { ops::cast(ctx, out[0], in[0]); }), {kExact}));
  cases.push_back(make_case("cast_scaled_bf16_to_e5m2_4M", {{Shape{int64_t(1) << 22}, BF16, -3, 3}},
                   {{Shape{int64_t(1) << 22}, F8E5M2}, {Shape{1}, F32}},
                   one([](Context& ctx, auto& in, auto& out) { ops::cast_scaled(ctx, out[0], out[1], in[0], 1e4f); }),
                   {kExact, kExact}));
  cases.push_back(make_case("fill_normal_f32_16M_base2", {}, {{Shape{int64_t(1) << 24}, F32}},
                   one([](Context& ctx, auto&, auto& out) { ops::fill_normal(ctx, out[0], 5, 6, 0.0, 1.0, 2); }),
                   {1e-12}));
  cases.push_back(make_case("fill_uniform_bf16_16M", {}, {{Shape{int64_t(1) << 24}, BF16}},
                   one([](Context& ctx, auto&, auto& out) { ops::fill_uniform(ctx, out[0], 5, 6, -1.0, 1.0); }),
                   {kExact}));
  cases.push_back(make_case("add_bf16_16M", {{Shape{int64_t(1) << 24}, BF16}, {Shape{int64_t(1) << 24}, BF16}},
                   {{Shape{int64_t(1) << 24}, BF16}},
                   one([](Context& ctx, auto& in, auto& out) { ops::add(ctx, out[0], in[0], in[1]); })));
  return cases;
}
class ElementwiseGpuLarge : public ::testing::TestWithParam<OpCase> {};
TEST_P(ElementwiseGpuLarge, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, ElementwiseGpuLarge, ::testing::ValuesIn(large_cases()),
                         [](const auto& info) { return testing::gtest_name(info.param.name); });

// ---- independent properties of the CPU reference

Context& cpu() { return testing::cpu_context(); }

TEST(ElementwiseReference, FillUniformShardsEqualTheWhole) {
  Tensor whole = cpu().empty(Shape{1001}, F32);
  ops::fill_uniform(cpu(), whole, 11, 2, -1.0, 1.0);
  Tensor a = cpu().empty(Shape{333}, F32), b = cpu().empty(Shape{668}, F32);
  ops::fill_uniform(cpu(), a, 11, 2, -1.0, 1.0, 0);
  ops::fill_uniform(cpu(), b, 11, 2, -1.0, 1.0, 333);
  EXPECT_EQ(std::memcmp(whole.data_ptr(), a.data_ptr(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(whole.data<float>() + 333, b.data_ptr(), b.nbytes()), 0);
  for (int64_t i = 0; i < 1001; ++i) {
    float v = whole.data<float>()[i];
    EXPECT_TRUE(v >= -1.0f && v <= 1.0f) << v;
    EXPECT_EQ(v, -1.0f + 2.0f * philox_uniform(11, 2, uint64_t(i)));
  }
}

TEST(ElementwiseReference, FillNormalMomentsAndFormula) {
  Tensor t = cpu().empty(Shape{1 << 16}, F64);
  ops::fill_normal(cpu(), t, 3, 4, 2.0, 0.5);
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.data<double>()[i];
    ASSERT_EQ(v, 2.0 + 0.5 * double(philox_normal(3, 4, uint64_t(i))));
    s += v;
    s2 += v * v;
  }
  double mean = s / double(t.numel()), var = s2 / double(t.numel()) - mean * mean;
  EXPECT_NEAR(mean, 2.0, 0.01);
  EXPECT_NEAR(var, 0.25, 0.01);
}

TEST(ElementwiseReference, TransposeTwiceIsIdentityAndMovesElements) {
  Tensor x = cpu().empty(Shape{3, 5, 7}, F32), y = cpu().empty(Shape{3, 7, 5}, F32), z = cpu().empty(Shape{3, 5, 7}, F32);
  testing::fill_random(x, 1);
  ops::transpose(cpu(), y, x);
  ops::transpose(cpu(), z, y);
  EXPECT_EQ(std::memcmp(x.data_ptr(), z.data_ptr(), x.nbytes()), 0);
  EXPECT_EQ(y.data<float>()[(2 * 7 + 6) * 5 + 4], x.data<float>()[(2 * 5 + 4) * 7 + 6]);
}

TEST(ElementwiseReference, ReductionsAgainstDirectSums) {
  Tensor x = cpu().empty(Shape{13, 17}, F32);
  testing::fill_random(x, 2);
  Tensor rows = cpu().empty(Shape{13}, F32), cols = cpu().empty(Shape{17}, F32), all = cpu().empty(Shape{1}, F32),
         mx = cpu().empty(Shape{1}, F32);
  ops::sum_rows(cpu(), rows, x);
  ops::sum_columns(cpu(), cols, x);
  ops::sum_all(cpu(), all, x);
  ops::amax(cpu(), mx, x);
  const float* p = x.data<float>();
  double total = 0, biggest = 0;
  for (int r = 0; r < 13; ++r) {
    double s = 0;
    for (int c = 0; c < 17; ++c) s += p[r * 17 + c], biggest = std::max(biggest, std::fabs(double(p[r * 17 + c])));
    EXPECT_NEAR(rows.data<float>()[r], s, 1e-5);
    total += s;
  }
  for (int c = 0; c < 17; ++c) {
    double s = 0;
    for (int r = 0; r < 13; ++r) s += p[r * 17 + c];
    EXPECT_NEAR(cols.data<float>()[c], s, 1e-5);
  }
  EXPECT_NEAR(all.data<float>()[0], total, 1e-4);
  EXPECT_EQ(double(mx.data<float>()[0]), biggest);
  p = nullptr;
  x.data<float>()[100] = std::numeric_limits<float>::quiet_NaN();
  ops::amax(cpu(), mx, x);
  EXPECT_TRUE(std::isnan(mx.data<float>()[0]));
}

TEST(ElementwiseReference, CastRulesForIntegersAndFp8) {
  Tensor f = cpu().empty(Shape{6}, F32), i8 = cpu().empty(Shape{6}, I8), e4 = cpu().empty(Shape{6}, F8E4M3);
  float vals[6] = {-1000.0f, -2.7f, 2.7f, 1000.0f, std::numeric_limits<float>::quiet_NaN(), 127.9f};
  std::memcpy(f.data_ptr(), vals, sizeof(vals));
  ops::cast(cpu(), i8, f);
  int8_t want[6] = {-128, -2, 2, 127, 0, 127};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(i8.data<int8_t>()[k], want[k]) << k;
  ops::cast(cpu(), e4, f);
  EXPECT_EQ(e4.data<fp8e4m3_t>()[0].bits, 0xfe);  // -448: saturated
  EXPECT_EQ(e4.data<fp8e4m3_t>()[3].bits, 0x7e);
  EXPECT_EQ(e4.data<fp8e4m3_t>()[4].bits, 0x7f);  // NaN
  EXPECT_EQ(to_float(e4.data<fp8e4m3_t>()[2]), 2.75f);  // 2.7 -> nearest of {2.5, 2.75}
}

TEST(ElementwiseReference, CastScaledAmaxIsOfTheUnscaledInput) {
  Tensor x = cpu().empty(Shape{4}, F32), y = cpu().empty(Shape{4}, F8E4M3), m = cpu().empty(Shape{1}, F32);
  float vals[4] = {0.5f, -3.0f, 1.0f, 2.0f};
  std::memcpy(x.data_ptr(), vals, sizeof(vals));
  ops::cast_scaled(cpu(), y, m, x, 100.0f);
  EXPECT_EQ(m.data<float>()[0], 3.0f);
  // Products 50, -300, 100, 200; E4M3 steps are 4 in [32, 64), 32 in [256, 448], 16 in [128, 256).
  EXPECT_EQ(to_float(y.data<fp8e4m3_t>()[0]), 48.0f);    // tie between 48 and 52: even mantissa
  EXPECT_EQ(to_float(y.data<fp8e4m3_t>()[1]), -288.0f);  // nearest of {-288, -320}
  EXPECT_EQ(to_float(y.data<fp8e4m3_t>()[2]), 96.0f);    // 100: tie between 96 and 104
  EXPECT_EQ(to_float(y.data<fp8e4m3_t>()[3]), 192.0f);   // tie between 192 and 208
}

// ---- validation

TEST(ElementwiseBadInput, ShapesDtypesAndCasts) {
  Tensor a = cpu().empty(Shape{4, 5}, F32), b = cpu().empty(Shape{5, 4}, F32), h = cpu().empty(Shape{4, 5}, BF16);
  Tensor i32 = cpu().empty(Shape{4, 5}, I32), col_bf16 = cpu().empty(Shape{5}, BF16);
  expect_error([&] { ops::add(cpu(), a, a, b); }, {"add", "[4, 5]", "[5, 4]"});
  expect_error([&] { ops::mul(cpu(), a, a, h); }, {"mul", "bf16"});
  expect_error([&] { ops::sum_columns(cpu(), col_bf16, a); }, {"sum_columns", "bf16[5]", "f32"});
  expect_error([&] { ops::sum_rows(cpu(), cpu().empty(Shape{5}, F32), a); }, {"sum_rows", "[4]"});
  expect_error([&] { ops::cast(cpu(), h, i32); }, {"cast", "i32", "bf16"});
  expect_error([&] { ops::transpose(cpu(), a, a); }, {"transpose", "[5, 4]"});
  expect_error([&] { ops::fill_uniform(cpu(), i32, 1, 2, 0.0, 1.0); }, {"fill_uniform", "i32"});
  expect_error([&] { ops::cast_scaled(cpu(), h, cpu().empty(Shape{2}, F32), a, 1.0f); }, {"cast_scaled", "amax", "[1]"});
}

}  // namespace
}  // namespace megatron
