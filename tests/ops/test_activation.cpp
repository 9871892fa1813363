// GELU (tanh), SiLU, SwiGLU: CUDA vs the CPU reference over dtypes and odd shapes (including rows that
// break 16-byte alignment), backward vs finite differences in fp64, an independent formula check, and
// argument validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "harness.h"
#include "megatron/ops/activation/activation.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;

enum class Act { Gelu, Silu, Swiglu };
const char* act_name(Act a) { return a == Act::Gelu ? "gelu" : a == Act::Silu ? "silu" : "swiglu"; }

void run_forward(Act a, Context& ctx, const Tensor& y, const Tensor& x) {
  if (a == Act::Gelu) ops::gelu_forward(ctx, y, x);
  else if (a == Act::Silu) ops::silu_forward(ctx, y, x);
  else ops::swiglu_forward(ctx, y, x);
}
void run_backward(Act a, Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  if (a == Act::Gelu) ops::gelu_backward(ctx, dx, dy, x);
  else if (a == Act::Silu) ops::silu_backward(ctx, dx, dy, x);
  else ops::swiglu_backward(ctx, dx, dy, x);
}

// For SwiGLU `h` is F: x is [r, 2F] and y [r, F].
OpCase act_case(Act a, bool backward, DType dt, int64_t r, int64_t h) {
  OpCase c;
  c.name = str_cat(act_name(a), backward ? "_bwd_" : "_fwd_", dtype_name(dt), "_", r, "x", h);
  const Shape xs = a == Act::Swiglu ? Shape{r, 2 * h} : Shape{r, h};
  const Shape ys{r, h};
  if (backward) {
    c.inputs = {TensorSpec{ys, dt, -1.0, 1.0}, TensorSpec{xs, dt, -5.0, 5.0}};
    c.outputs = {TensorSpec{xs, dt}};
    c.run = [a](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      run_backward(a, ctx, out[0], in[0], in[1]);
    };
  } else {
    c.inputs = {TensorSpec{xs, dt, -5.0, 5.0}};
    c.outputs = {TensorSpec{ys, dt}};
    c.run = [a](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
      run_forward(a, ctx, out[0], in[0]);
    };
  }
  return c;
}

std::vector<OpCase> activation_cases() {
  std::vector<OpCase> cases;
  const int64_t rows[] = {1, 7, 129, 1000};
  const int64_t hiddens[] = {1, 7, 129, 1024, 4097};
  for (Act a : {Act::Gelu, Act::Silu, Act::Swiglu})
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (int64_t r : rows)
        for (int64_t h : hiddens) {
          if (r * h > 200000 && dt != DType::BF16) continue;  // the largest shapes once per op (CPU time)
          cases.push_back(act_case(a, false, dt, r, h));
          cases.push_back(act_case(a, true, dt, r, h));
        }
  return cases;
}
MEGATRON_OP_CASES(Activation, activation_cases);

// A view that starts one element into its storage: every pointer misaligned for 16-byte vectors.
TEST(ActivationGpuMisaligned, ViewsOffsetByOneElement) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  for (Act a : {Act::Gelu, Act::Silu, Act::Swiglu})
    for (DType dt : {DType::BF16, DType::F32}) {
      const int64_t r = 33, f = 64, xw = a == Act::Swiglu ? 2 * f : f;
      // Rows of a [r + 1, w] tensor viewed from element 1 as [r, w] (flat): offset by one element.
      auto make = [&](Context& ctx, int64_t w, uint64_t seed) {
        Tensor host = cpu.empty(Shape{r * w + 1}, dt);
        testing::fill_random(host, seed, -3, 3);
        Tensor t = ctx.is_cuda() ? to_device(ctx, host, ctx.device(), cpu.allocator()) : host;
        return t.slice(1, r * w + 1).view({r, w});
      };
      std::vector<std::vector<double>> results;
      for (Context* ctx : {&cpu, &gpu}) {
        Tensor x = make(*ctx, xw, 1), dy = make(*ctx, f, 2), y = make(*ctx, f, 3), dx = make(*ctx, xw, 4);
        run_forward(a, *ctx, y, x);
        run_backward(a, *ctx, dx, dy, x);
        std::vector<double> all = testing::to_doubles(*ctx, y);
        for (double d : testing::to_doubles(*ctx, dx)) all.push_back(d);
        results.push_back(all);
      }
      EXPECT_LE(testing::nmse(results[1], results[0]), testing::default_max_nmse(dt)) << act_name(a) << " " << dt;
    }
}

// ---- finite differences (fp64, CPU) ----
GradCase grad_case(Act a, int64_t r, int64_t h) {
  GradCase c;
  c.name = str_cat(act_name(a), "_", r, "x", h);
  const Shape xs = a == Act::Swiglu ? Shape{r, 2 * h} : Shape{r, h};
  c.inputs = {TensorSpec{xs, DType::F64, -5.0, 5.0}};
  c.differentiable = {0};
  c.forward = [=](Context& ctx, const std::vector<Tensor>& in) {
    Tensor y = ctx.empty(Shape{r, h}, DType::F64);
    run_forward(a, ctx, y, in[0]);
    return std::vector<Tensor>{y};
  };
  c.backward = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& gout) {
    Tensor dx = ctx.empty(in[0].shape(), DType::F64);
    run_backward(a, ctx, dx, gout[0], in[0]);
    return std::vector<Tensor>{dx};
  };
  return c;
}

std::vector<GradCase> activation_grad_cases() {
  std::vector<GradCase> cases;
  for (Act a : {Act::Gelu, Act::Silu, Act::Swiglu})
    for (auto [r, h] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {4, 129}}) cases.push_back(grad_case(a, r, h));
  return cases;
}
MEGATRON_GRAD_CASES(Activation, activation_grad_cases);

// ---- independent formulas ----
TEST(ActivationFormula, MatchesClosedForms) {
  Context& ctx = testing::cpu_context();
  const double xs[] = {-6.0, -1.5, -0.25, 0.0, 0.3, 1.0, 2.5, 8.0};
  const int64_t n = 8;
  Tensor x = ctx.empty({n}, DType::F64), y = ctx.empty({n}, DType::F64);
  for (int64_t i = 0; i < n; ++i) x.data<double>()[i] = xs[i];
  ops::gelu_forward(ctx, y, x);
  for (int64_t i = 0; i < n; ++i) {
    const double v = xs[i];
    const double expect = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y.data<double>()[i], expect, 1e-15) << "gelu(" << v << ")";
    // The tanh approximation stays within 1e-3 of the exact erf GELU.
    EXPECT_NEAR(y.data<double>()[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-3) << "gelu(" << v << ")";
  }
  ops::silu_forward(ctx, y, x);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y.data<double>()[i], xs[i] / (1 + std::exp(-xs[i])), 1e-15);
  // SwiGLU of [gate | up] equals silu(gate) * up, columnwise.
  Tensor x2 = ctx.empty({2, 4}, DType::F64), y2 = ctx.empty({2, 2}, DType::F64);
  for (int64_t i = 0; i < 8; ++i) x2.data<double>()[i] = xs[i];
  ops::swiglu_forward(ctx, y2, x2);
  for (int64_t rr = 0; rr < 2; ++rr)
    for (int64_t cc = 0; cc < 2; ++cc) {
      const double g = xs[rr * 4 + cc], u = xs[rr * 4 + 2 + cc];
      EXPECT_NEAR(y2.data<double>()[rr * 2 + cc], g / (1 + std::exp(-g)) * u, 1e-15);
    }
}

// ---- bad input ----
TEST(ActivationBadInput, ShapesAndDtypes) {
  Context& ctx = testing::cpu_context();
  Tensor x = ctx.empty({4, 6}, DType::F32), y_bad = ctx.empty({4, 5}, DType::F32), y_bf16 = ctx.empty({4, 6}, DType::BF16);
  expect_error([&] { ops::gelu_forward(ctx, y_bad, x); }, {"gelu_forward", "y", "[4, 5]", "[4, 6]"});
  expect_error([&] { ops::silu_forward(ctx, y_bf16, x); }, {"silu_forward", "y", "bf16[4, 6]", "f32"});
  Tensor xi = ctx.empty({4, 6}, DType::I32);
  expect_error([&] { ops::gelu_forward(ctx, xi, xi); }, {"gelu_forward", "x", "i32[4, 6]"});
  Tensor dy_bad = ctx.empty({6, 4}, DType::F32), dx = ctx.empty({4, 6}, DType::F32);
  expect_error([&] { ops::silu_backward(ctx, dx, dy_bad, x); }, {"silu_backward", "dy", "[6, 4]"});
}

TEST(ActivationBadInput, SwigluLayout) {
  Context& ctx = testing::cpu_context();
  Tensor x_odd = ctx.empty({3, 7}, DType::F32), y = ctx.empty({3, 3}, DType::F32);
  expect_error([&] { ops::swiglu_forward(ctx, y, x_odd); }, {"swiglu_forward", "x", "f32[3, 7]", "even"});
  Tensor x = ctx.empty({3, 8}, DType::F32), y_wrong = ctx.empty({3, 8}, DType::F32);
  expect_error([&] { ops::swiglu_forward(ctx, y_wrong, x); }, {"swiglu_forward", "y", "[3, 8]", "[3, 4]"});
  Tensor dy = ctx.empty({3, 4}, DType::F32), dx_wrong = ctx.empty({3, 4}, DType::F32);
  expect_error([&] { ops::swiglu_backward(ctx, dx_wrong, dy, x); }, {"swiglu_backward", "dx", "[3, 4]", "[3, 8]"});
}

TEST(ActivationBadInput, WrongDevice) {
  Context& ctx = testing::cpu_context();
  Tensor x = ctx.empty({4}, DType::F32);
  Tensor y_gpu = Tensor::from_blob(x.data_ptr(), Shape{4}, DType::F32, Device::cuda(0));
  expect_error([&] { ops::gelu_forward(ctx, y_gpu, x); }, {"gelu_forward", "y", "cuda:0"});
}

}  // namespace
}  // namespace megatron
