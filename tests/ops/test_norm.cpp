// LayerNorm / RMSNorm: CUDA vs the CPU reference over dtypes, odd shapes, fused residual, accumulation;
// backward vs finite differences in fp64; argument validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "harness.h"
#include "megatron/ops/norm/norm.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;

constexpr float kEps = 1e-5f;

struct NormVariant {
  bool rms = false;
  DType dtype = DType::F32;
  DType wdtype = DType::F32;
  bool bias = true;       // LayerNorm only
  bool residual = false;  // forward: fused residual add; backward: dresidual input
  bool accumulate = false;
};

std::string variant_name(const char* what, const NormVariant& v, int64_t r, int64_t h) {
  return str_cat(v.rms ? "rms_" : "ln_", what, "_", dtype_name(v.dtype), "_w", dtype_name(v.wdtype),
                 v.bias && !v.rms ? "_bias" : "", v.residual ? "_res" : "", v.accumulate ? "_acc" : "", "_", r,
                 "x", h);
}

OpCase forward_case(const NormVariant& v, int64_t r, int64_t h) {
  OpCase c;
  c.name = variant_name("fwd", v, r, h);
  const bool bias = v.bias && !v.rms;
  // x has a non-zero mean so that LayerNorm's centring matters.
  c.inputs.push_back(TensorSpec{Shape{r, h}, v.dtype, -1.0, 3.0});
  if (v.residual) c.inputs.push_back(TensorSpec{Shape{r, h}, v.dtype, -1.0, 1.0});
  c.inputs.push_back(TensorSpec{Shape{h}, v.wdtype, 0.5, 1.5});
  if (bias) c.inputs.push_back(TensorSpec{Shape{h}, v.wdtype, -0.5, 0.5});
  c.outputs.push_back(TensorSpec{Shape{r, h}, v.dtype});
  if (v.residual) c.outputs.push_back(TensorSpec{Shape{r, h}, v.dtype});
  if (!v.rms) c.outputs.push_back(TensorSpec{Shape{r}, DType::F32});
  c.outputs.push_back(TensorSpec{Shape{r}, DType::F32});
  c.run = [v, bias](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    size_t i = 0, o = 0;
    Tensor x = in[i++];
    Tensor res = v.residual ? in[i++] : Tensor();
    Tensor w = in[i++];
    Tensor b = bias ? in[i++] : Tensor();
    Tensor y = out[o++];
    Tensor res_out = v.residual ? out[o++] : Tensor();
    Tensor mean = v.rms ? Tensor() : out[o++];
    Tensor rstd = out[o++];
    if (v.rms) {
      if (v.residual) ops::rms_norm_forward(ctx, y, res_out, rstd, x, res, w, kEps);
      else ops::rms_norm_forward(ctx, y, rstd, x, w, kEps);
    } else {
      if (v.residual) ops::layer_norm_forward(ctx, y, res_out, mean, rstd, x, res, w, b, kEps);
      else ops::layer_norm_forward(ctx, y, mean, rstd, x, w, b, kEps);
    }
  };
  return c;
}

OpCase backward_case(const NormVariant& v, int64_t r, int64_t h) {
  OpCase c;
  c.name = variant_name("bwd", v, r, h);
  const bool bias = v.bias && !v.rms;
  // Inputs: dy, x, weight, [mean], rstd, [dresidual], [dweight0, [dbias0]].
  c.inputs.push_back(TensorSpec{Shape{r, h}, v.dtype, -1.0, 1.0});
  c.inputs.push_back(TensorSpec{Shape{r, h}, v.dtype, -1.0, 3.0});
  c.inputs.push_back(TensorSpec{Shape{h}, v.wdtype, 0.5, 1.5});
  if (!v.rms) c.inputs.push_back(TensorSpec{Shape{r}, DType::F32, 0.0, 2.0});
  c.inputs.push_back(TensorSpec{Shape{r}, DType::F32, 0.5, 2.0});
  if (v.residual) c.inputs.push_back(TensorSpec{Shape{r, h}, v.dtype, -1.0, 1.0});
  const int first_acc = int(c.inputs.size());
  if (v.accumulate) {
    c.inputs.push_back(TensorSpec{Shape{h}, DType::F32, -4.0, 4.0});
    if (bias) c.inputs.push_back(TensorSpec{Shape{h}, DType::F32, -4.0, 4.0});
  }
  c.outputs.push_back(TensorSpec{Shape{r, h}, v.dtype});
  c.outputs.push_back(TensorSpec{Shape{h}, DType::F32});
  if (bias) c.outputs.push_back(TensorSpec{Shape{h}, DType::F32});
  if (v.accumulate) {
    c.output_starts_as_input.push_back({1, first_acc});
    if (bias) c.output_starts_as_input.push_back({2, first_acc + 1});
  }
  c.run = [v, bias](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    size_t i = 0;
    Tensor dy = in[i++], x = in[i++], w = in[i++];
    Tensor mean = v.rms ? Tensor() : in[i++];
    Tensor rstd = in[i++];
    Tensor dres = v.residual ? in[i++] : Tensor();
    if (v.rms) ops::rms_norm_backward(ctx, out[0], out[1], dy, x, w, rstd, v.accumulate, dres);
    else ops::layer_norm_backward(ctx, out[0], out[1], bias ? out[2] : Tensor(), dy, x, w, mean, rstd, v.accumulate, dres);
  };
  return c;
}

std::vector<OpCase> norm_cases() {
  std::vector<OpCase> cases;
  const int64_t rows[] = {1, 7, 129, 1000};
  const int64_t hiddens[] = {1, 7, 129, 1024, 4097};
  for (bool rms : {false, true})
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (int64_t r : rows)
        for (int64_t h : hiddens) {
          if (r * h > 200000 && dt != DType::BF16) continue;  // the largest shapes once per op (CPU time)
          NormVariant v{.rms = rms, .dtype = dt, .wdtype = dt};
          cases.push_back(forward_case(v, r, h));
          cases.push_back(backward_case(v, r, h));
        }
  // Variants: fp32 weights with narrow activations, no bias, fused residual, accumulation, F64 on CPU only
  // (F64 is not a CUDA dtype, so it is covered by the gradient checks below).
  for (bool rms : {false, true})
    for (DType dt : {DType::BF16, DType::F16, DType::F32})
      for (auto [r, h] : {std::pair<int64_t, int64_t>{7, 1024}, {129, 4097}, {33, 7}, {1000, 256}}) {
        cases.push_back(forward_case({.rms = rms, .dtype = dt, .wdtype = DType::F32}, r, h));
        cases.push_back(forward_case({.rms = rms, .dtype = dt, .wdtype = dt, .residual = true}, r, h));
        cases.push_back(forward_case({.rms = rms, .dtype = dt, .wdtype = DType::F32, .residual = true}, r, h));
        cases.push_back(backward_case({.rms = rms, .dtype = dt, .wdtype = DType::F32}, r, h));
        cases.push_back(backward_case({.rms = rms, .dtype = dt, .wdtype = dt, .residual = true}, r, h));
        cases.push_back(backward_case({.rms = rms, .dtype = dt, .wdtype = dt, .accumulate = true}, r, h));
        cases.push_back(
            backward_case({.rms = rms, .dtype = dt, .wdtype = DType::F32, .residual = true, .accumulate = true}, r, h));
        if (!rms) {
          cases.push_back(forward_case({.dtype = dt, .wdtype = dt, .bias = false}, r, h));
          cases.push_back(backward_case({.dtype = dt, .wdtype = dt, .bias = false, .accumulate = true}, r, h));
        }
      }
  // Variants with wdtype == dtype == F32 repeat grid cases: keep the first of each name.
  std::vector<OpCase> unique;
  std::set<std::string> seen;
  for (auto& c : cases)
    if (seen.insert(c.name).second) unique.push_back(std::move(c));
  return unique;
}
MEGATRON_OP_CASES(Norm, norm_cases);

// Wide rows (the uncached fallback paths: forward H > 16384, backward H > 8192), many rows per backward
// slot, and narrow rows with many rows per slot. GPU only: the CPU reference is slow at these sizes.
std::vector<OpCase> norm_large_cases() {
  std::vector<OpCase> cases;
  for (bool rms : {false, true}) {
    cases.push_back(forward_case({.rms = rms, .dtype = DType::BF16, .wdtype = DType::BF16, .residual = true}, 40, 20000));
    cases.push_back(forward_case({.rms = rms, .dtype = DType::F32, .wdtype = DType::F32}, 33, 16385));
    cases.push_back(forward_case({.rms = rms, .dtype = DType::BF16, .wdtype = DType::F32}, 64, 16384));
    cases.push_back(backward_case({.rms = rms, .dtype = DType::BF16, .wdtype = DType::BF16, .residual = true}, 1200, 8200));
    cases.push_back(backward_case({.rms = rms, .dtype = DType::F32, .wdtype = DType::F32, .accumulate = true}, 33, 16385));
    cases.push_back(backward_case({.rms = rms, .dtype = DType::BF16, .wdtype = DType::F32}, 64, 16384));
    cases.push_back(backward_case({.rms = rms, .dtype = DType::BF16, .wdtype = DType::BF16, .accumulate = true}, 5000, 7));
    cases.push_back(backward_case({.rms = rms, .dtype = DType::F16, .wdtype = DType::F16}, 3000, 4096));
  }
  return cases;
}
class NormGpuLarge : public ::testing::TestWithParam<OpCase> {};
TEST_P(NormGpuLarge, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, NormGpuLarge, ::testing::ValuesIn(norm_large_cases()),
                         [](const auto& info) { return testing::gtest_name(info.param.name); });

// ---- finite differences (fp64, CPU) ----
GradCase grad_case(bool rms, bool residual, bool bias, int64_t r, int64_t h) {
  GradCase c;
  c.name = str_cat(rms ? "rms" : "ln", residual ? "_res" : "", bias ? "_bias" : "", "_", r, "x", h);
  // Inputs: x, [residual], weight, [bias].
  c.inputs.push_back(TensorSpec{Shape{r, h}, DType::F64, -1.0, 3.0});
  if (residual) c.inputs.push_back(TensorSpec{Shape{r, h}, DType::F64, -1.0, 1.0});
  c.inputs.push_back(TensorSpec{Shape{h}, DType::F64, 0.5, 1.5});
  if (bias) c.inputs.push_back(TensorSpec{Shape{h}, DType::F64, -0.5, 0.5});
  for (int i = 0; i < int(c.inputs.size()); ++i) c.differentiable.push_back(i);
  // Larger than the default: with H = 1 the RMSNorm gradient is ~eps, which must stay above the FD noise.
  const float eps = h == 1 ? 0.1f : 1e-3f;
  c.forward = [=](Context& ctx, const std::vector<Tensor>& in) {
    size_t i = 0;
    Tensor x = in[i++];
    Tensor res = residual ? in[i++] : Tensor();
    Tensor w = in[i++];
    Tensor b = bias ? in[i++] : Tensor();
    Tensor y = ctx.empty(x.shape(), DType::F64), mean = ctx.empty(Shape{r}, DType::F64),
           rstd = ctx.empty(Shape{r}, DType::F64);
    if (!residual) {
      if (rms) ops::rms_norm_forward(ctx, y, rstd, x, w, eps);
      else ops::layer_norm_forward(ctx, y, mean, rstd, x, w, b, eps);
      return std::vector<Tensor>{y};
    }
    Tensor res_out = ctx.empty(x.shape(), DType::F64);
    if (rms) ops::rms_norm_forward(ctx, y, res_out, rstd, x, res, w, eps);
    else ops::layer_norm_forward(ctx, y, res_out, mean, rstd, x, res, w, b, eps);
    return std::vector<Tensor>{y, res_out};
  };
  c.backward = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& gout) {
    size_t i = 0;
    Tensor x = in[i++];
    Tensor res = residual ? in[i++] : Tensor();
    Tensor w = in[i++];
    Tensor b = bias ? in[i++] : Tensor();
    // Recompute the statistics (and the normalised input) as a training step would have saved them.
    Tensor y = ctx.empty(x.shape(), DType::F64), mean = ctx.empty(Shape{r}, DType::F64),
           rstd = ctx.empty(Shape{r}, DType::F64), normed = x;
    if (residual) {
      normed = ctx.empty(x.shape(), DType::F64);
      if (rms) ops::rms_norm_forward(ctx, y, normed, rstd, x, res, w, eps);
      else ops::layer_norm_forward(ctx, y, normed, mean, rstd, x, res, w, b, eps);
    } else if (rms) {
      ops::rms_norm_forward(ctx, y, rstd, x, w, eps);
    } else {
      ops::layer_norm_forward(ctx, y, mean, rstd, x, w, b, eps);
    }
    Tensor dx = ctx.empty(x.shape(), DType::F64), dw = ctx.empty(Shape{h}, DType::F64),
           db = bias ? ctx.empty(Shape{h}, DType::F64) : Tensor();
    Tensor dres = residual ? gout[1] : Tensor();
    if (rms) ops::rms_norm_backward(ctx, dx, dw, gout[0], normed, w, rstd, false, dres);
    else ops::layer_norm_backward(ctx, dx, dw, db, gout[0], normed, w, mean, rstd, false, dres);
    std::vector<Tensor> grads{dx};
    if (residual) grads.push_back(dx);  // d(x + residual)/dresidual = d/dx
    grads.push_back(dw);
    if (bias) grads.push_back(db);
    return grads;
  };
  return c;
}

std::vector<GradCase> norm_grad_cases() {
  std::vector<GradCase> cases;
  for (auto [r, h] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 33}, {2, 129}}) {
    cases.push_back(grad_case(false, false, true, r, h));
    cases.push_back(grad_case(false, false, false, r, h));
    cases.push_back(grad_case(true, false, false, r, h));
    cases.push_back(grad_case(false, true, true, r, h));
    cases.push_back(grad_case(true, true, false, r, h));
  }
  return cases;
}
MEGATRON_GRAD_CASES(Norm, norm_grad_cases);

// ---- semantics the tables do not pin down ----
Tensor cpu_random(const Shape& s, DType dt, uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = testing::cpu_context().empty(s, dt);
  testing::fill_random(t, seed, lo, hi);
  return t;
}

TEST(NormSemantics, AccumulateAddsToWhatWasThere) {
  Context& ctx = testing::cpu_context();
  const int64_t r = 9, h = 13;
  Tensor dy = cpu_random({r, h}, DType::F32, 1), x = cpu_random({r, h}, DType::F32, 2), w = cpu_random({h}, DType::F32, 3);
  Tensor mean = cpu_random({r}, DType::F32, 4), rstd = cpu_random({r}, DType::F32, 5, 0.5, 2);
  Tensor dx = ctx.empty({r, h}, DType::F32), dw = ctx.empty({h}, DType::F32), db = ctx.empty({h}, DType::F32);
  ops::layer_norm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, false);
  std::vector<double> dw1 = testing::to_doubles(ctx, dw), db1 = testing::to_doubles(ctx, db);
  ops::layer_norm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, true);
  std::vector<double> dw2 = testing::to_doubles(ctx, dw), db2 = testing::to_doubles(ctx, db);
  for (int64_t c = 0; c < h; ++c) {
    EXPECT_NEAR(dw2[size_t(c)], 2 * dw1[size_t(c)], 1e-5 * (1 + std::abs(dw1[size_t(c)])));
    EXPECT_NEAR(db2[size_t(c)], 2 * db1[size_t(c)], 1e-5 * (1 + std::abs(db1[size_t(c)])));
  }
}

// The fused residual variant equals "add, round, then normalise" done as two steps.
TEST(NormSemantics, FusedResidualEqualsAddThenNorm) {
  Context& ctx = testing::cpu_context();
  const int64_t r = 5, h = 40;
  for (DType dt : {DType::BF16, DType::F32}) {
    Tensor x = cpu_random({r, h}, dt, 11), res = cpu_random({r, h}, dt, 12), w = cpu_random({h}, dt, 13);
    Tensor sum = ctx.empty({r, h}, dt);
    visit_float_dtype(dt, "test", [&]<class T>() {
      for (int64_t i = 0; i < r * h; ++i)
        sum.data<T>()[i] = from_double<T>(to_double(x.data<T>()[i]) + to_double(res.data<T>()[i]));
    });
    Tensor y1 = ctx.empty({r, h}, dt), y2 = ctx.empty({r, h}, dt), res_out = ctx.empty({r, h}, dt);
    Tensor rstd1 = ctx.empty({r}, DType::F32), rstd2 = ctx.empty({r}, DType::F32);
    ops::rms_norm_forward(ctx, y1, res_out, rstd1, x, res, w, kEps);
    ops::rms_norm_forward(ctx, y2, rstd2, sum, w, kEps);
    EXPECT_EQ(std::memcmp(res_out.data_ptr(), sum.data_ptr(), sum.nbytes()), 0);
    EXPECT_EQ(std::memcmp(y1.data_ptr(), y2.data_ptr(), y1.nbytes()), 0);
    EXPECT_EQ(std::memcmp(rstd1.data_ptr(), rstd2.data_ptr(), rstd1.nbytes()), 0);
  }
}

// Independent property: with w = 1, b = 0 and eps = 0, every row of y has mean 0 and variance 1.
TEST(NormSemantics, LayerNormRowsAreStandardised) {
  Context& ctx = testing::cpu_context();
  const int64_t r = 4, h = 300;
  Tensor x = cpu_random({r, h}, DType::F64, 21, -2, 5);
  Tensor w = ctx.empty({h}, DType::F64), b = ctx.empty({h}, DType::F64);
  for (int64_t c = 0; c < h; ++c) {
    w.data<double>()[c] = 1.0;
    b.data<double>()[c] = 0.0;
  }
  Tensor y = ctx.empty({r, h}, DType::F64), mean = ctx.empty({r}, DType::F64), rstd = ctx.empty({r}, DType::F64);
  ops::layer_norm_forward(ctx, y, mean, rstd, x, w, b, 0.0f);
  for (int64_t i = 0; i < r; ++i) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < h; ++c) m += y.data<double>()[i * h + c];
    for (int64_t c = 0; c < h; ++c) v += y.data<double>()[i * h + c] * y.data<double>()[i * h + c];
    EXPECT_NEAR(m / h, 0.0, 1e-12);
    EXPECT_NEAR(v / h, 1.0, 1e-12);
  }
}

// Same inputs, same device: bit-identical weight gradients (no atomics).
TEST(NormGpuDeterminism, BackwardIsBitReproducible) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& ctx = testing::cuda_context();
  const int64_t r = 4099, h = 1536;
  auto dev = [&](const Tensor& t) { return to_device(ctx, t, ctx.device(), cpu.allocator()); };
  Tensor dy = dev(cpu_random({r, h}, DType::BF16, 31)), x = dev(cpu_random({r, h}, DType::BF16, 32));
  Tensor w = dev(cpu_random({h}, DType::F32, 33)), mean = dev(cpu_random({r}, DType::F32, 34));
  Tensor rstd = dev(cpu_random({r}, DType::F32, 35, 0.5, 2));
  std::vector<std::vector<double>> runs;
  for (int k = 0; k < 2; ++k) {
    Tensor dx = ctx.empty({r, h}, DType::BF16), dw = ctx.empty({h}, DType::F32), db = ctx.empty({h}, DType::F32);
    ops::layer_norm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, false);
    std::vector<double> all = testing::to_doubles(ctx, dw);
    for (double d : testing::to_doubles(ctx, db)) all.push_back(d);
    for (double d : testing::to_doubles(ctx, dx)) all.push_back(d);
    runs.push_back(all);
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

// ---- bad input ----
TEST(NormBadInput, WrongWeightShape) {
  Context& ctx = testing::cpu_context();
  Tensor x = cpu_random({3, 7}, DType::F32, 1), w = cpu_random({5}, DType::F32, 2);
  Tensor y = ctx.empty({3, 7}, DType::F32), rstd = ctx.empty({3}, DType::F32);
  expect_error([&] { ops::rms_norm_forward(ctx, y, rstd, x, w, kEps); }, {"rms_norm_forward", "weight", "[5]", "[7]"});
}

TEST(NormBadInput, WrongStatsShapeAndDtype) {
  Context& ctx = testing::cpu_context();
  Tensor x = cpu_random({3, 7}, DType::BF16, 1), w = cpu_random({7}, DType::BF16, 2), b = cpu_random({7}, DType::BF16, 3);
  Tensor y = ctx.empty({3, 7}, DType::BF16), mean = ctx.empty({3}, DType::F32);
  Tensor rstd_bad_shape = ctx.empty({7}, DType::F32), rstd_bad_dtype = ctx.empty({3}, DType::BF16);
  expect_error([&] { ops::layer_norm_forward(ctx, y, mean, rstd_bad_shape, x, w, b, kEps); },
               {"layer_norm_forward", "rstd", "[7]", "[3]"});
  expect_error([&] { ops::layer_norm_forward(ctx, y, mean, rstd_bad_dtype, x, w, b, kEps); },
               {"layer_norm_forward", "rstd", "bf16[3]", "f32"});
}

TEST(NormBadInput, WeightDtypeMustBeInputOrF32) {
  Context& ctx = testing::cpu_context();
  Tensor x = cpu_random({2, 4}, DType::BF16, 1), w = cpu_random({4}, DType::F16, 2);
  Tensor y = ctx.empty({2, 4}, DType::BF16), rstd = ctx.empty({2}, DType::F32);
  expect_error([&] { ops::rms_norm_forward(ctx, y, rstd, x, w, kEps); }, {"rms_norm_forward", "weight", "f16[4]"});
  Tensor xi = ctx.empty({2, 4}, DType::I32), yi = ctx.empty({2, 4}, DType::I32), wi = cpu_random({4}, DType::F32, 3);
  expect_error([&] { ops::rms_norm_forward(ctx, yi, rstd, xi, wi, kEps); }, {"rms_norm_forward", "x", "i32[2, 4]"});
}

TEST(NormBadInput, BackwardShapes) {
  Context& ctx = testing::cpu_context();
  Tensor dy = cpu_random({3, 6}, DType::F32, 1), x = cpu_random({3, 6}, DType::F32, 2), w = cpu_random({6}, DType::F32, 3);
  Tensor mean = ctx.empty({3}, DType::F32), rstd = ctx.empty({3}, DType::F32);
  Tensor dx = ctx.empty({3, 6}, DType::F32), dw_bad = ctx.empty({6}, DType::BF16), dw = ctx.empty({6}, DType::F32);
  Tensor dres_bad = ctx.empty({3, 5}, DType::F32), dy_bad = ctx.empty({6, 3}, DType::F32);
  expect_error([&] { ops::layer_norm_backward(ctx, dx, dw_bad, Tensor(), dy, x, w, mean, rstd, false); },
               {"layer_norm_backward", "dweight", "bf16[6]"});
  expect_error([&] { ops::rms_norm_backward(ctx, dx, dw, dy, x, w, rstd, false, dres_bad); },
               {"rms_norm_backward", "dresidual", "[3, 5]", "[3, 6]"});
  expect_error([&] { ops::rms_norm_backward(ctx, dx, dw, dy_bad, x, w, rstd, false); },
               {"rms_norm_backward", "dy", "[6, 3]"});
}

TEST(NormBadInput, FusedResidualShapeAndEps) {
  Context& ctx = testing::cpu_context();
  Tensor x = cpu_random({2, 8}, DType::F32, 1), res = cpu_random({2, 9}, DType::F32, 2), w = cpu_random({8}, DType::F32, 3);
  Tensor y = ctx.empty({2, 8}, DType::F32), res_out = ctx.empty({2, 8}, DType::F32), rstd = ctx.empty({2}, DType::F32);
  expect_error([&] { ops::rms_norm_forward(ctx, y, res_out, rstd, x, res, w, kEps); },
               {"rms_norm_forward", "residual", "[2, 9]"});
  expect_error([&] { ops::rms_norm_forward(ctx, y, rstd, x, w, -1.0f); }, {"rms_norm_forward", "eps"});
  expect_error([&] { ops::rms_norm_forward(ctx, y, Tensor(), rstd, x, Tensor(), w, kEps); },
               {"rms_norm_forward", "residual"});
}

TEST(NormBadInput, WrongDevice) {
  Context& ctx = testing::cpu_context();
  Tensor x = cpu_random({2, 8}, DType::F32, 1), w = cpu_random({8}, DType::F32, 3);
  // A tensor that claims to live on a GPU (never dereferenced: validation rejects it first).
  Tensor w_gpu = Tensor::from_blob(w.data_ptr(), Shape{8}, DType::F32, Device::cuda(0));
  Tensor y = ctx.empty({2, 8}, DType::F32), rstd = ctx.empty({2}, DType::F32);
  expect_error([&] { ops::rms_norm_forward(ctx, y, rstd, x, w_gpu, kEps); }, {"rms_norm_forward", "weight", "cuda:0"});
}

}  // namespace
}  // namespace megatron
