// Dropout: CUDA and CPU agree bit for bit (same mask, same values); the kept fraction is 1-p within
// statistical bounds; shards with index_base reproduce the whole tensor's mask; p = 0 is the identity;
// backward regenerates the forward's mask; fused bias-dropout-add; finite differences; argument validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "harness.h"
#include "megatron/ops/dropout/dropout.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;

constexpr uint64_t kSeed = 0x5eed1234abcdull, kOffset = 77;

OpCase dropout_case(bool backward, DType dt, int64_t r, int64_t h, float p, uint64_t index_base) {
  OpCase c;
  c.name = str_cat(backward ? "dropout_bwd_" : "dropout_fwd_", dtype_name(dt), "_", r, "x", h, "_p",
                   int(p * 100), "_base", index_base);
  c.inputs = {TensorSpec{Shape{r, h}, dt, -2.0, 2.0}};
  c.outputs = {TensorSpec{Shape{r, h}, dt}};
  c.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    if (backward) ops::dropout_backward(ctx, out[0], in[0], p, kSeed, kOffset, index_base);
    else ops::dropout_forward(ctx, out[0], in[0], p, kSeed, kOffset, index_base);
  };
  return c;
}

OpCase bda_case(DType dt, int64_t r, int64_t h, float p, bool bias, uint64_t index_base) {
  OpCase c;
  c.name = str_cat("bias_dropout_add_", dtype_name(dt), bias ? "_bias_" : "_", r, "x", h, "_p", int(p * 100),
                   "_base", index_base);
  c.inputs = {TensorSpec{Shape{r, h}, dt, -2.0, 2.0}, TensorSpec{Shape{r, h}, dt, -2.0, 2.0}};
  if (bias) c.inputs.push_back(TensorSpec{Shape{h}, dt, -1.0, 1.0});
  c.outputs = {TensorSpec{Shape{r, h}, dt}};
  c.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    ops::bias_dropout_add_forward(ctx, out[0], in[0], bias ? in[2] : Tensor(), in[1], p, kSeed, kOffset, index_base);
  };
  return c;
}

std::vector<OpCase> dropout_cases() {
  std::vector<OpCase> cases;
  const int64_t rows[] = {1, 7, 129, 1000};
  const int64_t hiddens[] = {1, 7, 129, 1024, 4097};
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t r : rows)
      for (int64_t h : hiddens) {
        if (r * h > 200000 && dt != DType::BF16) continue;
        cases.push_back(dropout_case(false, dt, r, h, 0.1f, 0));
        cases.push_back(dropout_case(true, dt, r, h, 0.5f, 3));
        cases.push_back(bda_case(dt, r, h, 0.1f, true, 0));
      }
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (uint64_t base : {uint64_t(0), uint64_t(1), uint64_t(6), (uint64_t(1) << 33) + 2}) {
      cases.push_back(dropout_case(false, dt, 13, 100, 0.3f, base));
      cases.push_back(bda_case(dt, 13, 100, 0.3f, true, base));
      cases.push_back(bda_case(dt, 13, 100, 0.3f, false, base));
    }
  return cases;
}
MEGATRON_OP_CASES(Dropout, dropout_cases);

// ---- CUDA vs CPU, bit for bit ----
TEST(DropoutGpuExact, CudaEqualsCpuBitForBit) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (auto [r, h] : {std::pair<int64_t, int64_t>{1, 1}, {7, 129}, {1000, 4097}, {257, 1024}, {3, 7}})
      for (uint64_t base : {uint64_t(0), uint64_t(2), uint64_t(5), uint64_t(1) << 40})
        for (float p : {0.0f, 0.1f, 0.5f, 0.9f, 1.0f})
          for (bool bda : {false, true}) {
            Tensor x = cpu.empty({r, h}, dt), res = cpu.empty({r, h}, dt), b = cpu.empty({h}, dt);
            testing::fill_random(x, 1, -2, 2);
            testing::fill_random(res, 2, -2, 2);
            testing::fill_random(b, 3, -1, 1);
            Tensor y_cpu = cpu.empty({r, h}, dt);
            auto dev = [&](const Tensor& t) { return to_device(gpu, t, gpu.device(), cpu.allocator()); };
            Tensor xg = dev(x), resg = dev(res), bg = dev(b), y_gpu = gpu.empty({r, h}, dt);
            if (bda) {
              ops::bias_dropout_add_forward(cpu, y_cpu, x, b, res, p, kSeed, kOffset, base);
              ops::bias_dropout_add_forward(gpu, y_gpu, xg, bg, resg, p, kSeed, kOffset, base);
            } else {
              ops::dropout_forward(cpu, y_cpu, x, p, kSeed, kOffset, base);
              ops::dropout_forward(gpu, y_gpu, xg, p, kSeed, kOffset, base);
            }
            Tensor back = to_device(gpu, y_gpu, Device::cpu(), cpu.allocator());
            ASSERT_EQ(std::memcmp(back.data_ptr(), y_cpu.data_ptr(), y_cpu.nbytes()), 0)
                << (bda ? "bias_dropout_add " : "dropout ") << dt << " " << r << "x" << h << " base " << base << " p "
                << p;
          }
}

// ---- semantics (CPU; the GPU follows by the exact comparison above) ----
Tensor ones(Context& ctx, int64_t n, DType dt = DType::F32) {
  Tensor t = ctx.empty({n}, dt);
  visit_float_dtype(dt, "test", [&]<class T>() {
    for (int64_t i = 0; i < n; ++i) t.data<T>()[i] = from_double<T>(1.0);
  });
  return t;
}

TEST(DropoutSemantics, KeptFractionIsOneMinusP) {
  Context& ctx = testing::cpu_context();
  const int64_t n = 1 << 20;
  Tensor x = ones(ctx, n), y = ctx.empty({n}, DType::F32);
  for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    ops::dropout_forward(ctx, y, x, p, kSeed, kOffset);
    int64_t kept = 0;
    const float scale = float(1.0 / (1.0 - double(p)));
    for (int64_t i = 0; i < n; ++i) {
      const float v = y.data<float>()[i];
      ASSERT_TRUE(v == 0.f || v == scale) << "element " << i << " is " << v;
      kept += v != 0.f;
    }
    const double frac = double(kept) / double(n), sd = std::sqrt(double(p) * (1 - p) / double(n));
    EXPECT_NEAR(frac, 1.0 - p, 5 * sd) << "p = " << p;
  }
}

TEST(DropoutSemantics, ZeroIsIdentityAndOneDropsAll) {
  Context& ctx = testing::cpu_context();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    Tensor x = ctx.empty({37, 11}, dt), y = ctx.empty({37, 11}, dt);
    testing::fill_random(x, 5, -3, 3);
    ops::dropout_forward(ctx, y, x, 0.0f, kSeed, kOffset, 9);
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << dt;
    ops::dropout_forward(ctx, y, x, 1.0f, kSeed, kOffset, 9);
    for (double v : testing::to_doubles(ctx, y)) ASSERT_EQ(v, 0.0) << dt;
  }
}

// Shards of a tensor along dim 0 (at boundaries that are not multiples of 4) with index_base = their global
// start give exactly the whole tensor's result.
TEST(DropoutSemantics, ShardsReproduceTheWholeMask) {
  Context& ctx = testing::cpu_context();
  const int64_t r = 29, h = 13;
  Tensor x = ctx.empty({r, h}, DType::BF16), whole = ctx.empty({r, h}, DType::BF16), sharded = ctx.empty({r, h}, DType::BF16);
  testing::fill_random(x, 6, 0.5, 2);
  ops::dropout_forward(ctx, whole, x, 0.4f, kSeed, kOffset, 1000);
  const int64_t cuts[] = {0, 3, 4, 17, 29};
  for (int k = 0; k + 1 < 5; ++k)
    ops::dropout_forward(ctx, sharded.slice(cuts[k], cuts[k + 1]), x.slice(cuts[k], cuts[k + 1]), 0.4f, kSeed, kOffset,
                         1000 + uint64_t(cuts[k] * h));
  EXPECT_EQ(std::memcmp(whole.data_ptr(), sharded.data_ptr(), whole.nbytes()), 0);
}

TEST(DropoutGpuSemantics, ShardsReproduceTheWholeMask) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& ctx = testing::cuda_context();
  const int64_t r = 301, h = 1031;
  Tensor xh = cpu.empty({r, h}, DType::F32);
  testing::fill_random(xh, 7, 0.5, 2);
  Tensor x = to_device(ctx, xh, ctx.device(), cpu.allocator());
  Tensor whole = ctx.empty({r, h}, DType::F32), sharded = ctx.empty({r, h}, DType::F32);
  ops::dropout_forward(ctx, whole, x, 0.25f, kSeed, kOffset, 12);
  const int64_t cuts[] = {0, 1, 100, 101, 301};
  for (int k = 0; k + 1 < 5; ++k)
    ops::dropout_forward(ctx, sharded.slice(cuts[k], cuts[k + 1]), x.slice(cuts[k], cuts[k + 1]), 0.25f, kSeed,
                         kOffset, 12 + uint64_t(cuts[k] * h));
  EXPECT_TRUE(testing::to_doubles(ctx, whole) == testing::to_doubles(ctx, sharded));
}

TEST(DropoutSemantics, BackwardUsesTheForwardMask) {
  Context& ctx = testing::cpu_context();
  const int64_t n = 4099;
  Tensor x = ctx.empty({n}, DType::F32), dy = ctx.empty({n}, DType::F32);
  testing::fill_random(x, 8, 0.5, 2);  // never 0: a zero output means "dropped"
  testing::fill_random(dy, 9, 0.5, 2);
  Tensor y = ctx.empty({n}, DType::F32), dx = ctx.empty({n}, DType::F32);
  ops::dropout_forward(ctx, y, x, 0.3f, kSeed, kOffset, 5);
  ops::dropout_backward(ctx, dx, dy, 0.3f, kSeed, kOffset, 5);
  const float scale = float(1.0 / 0.7);
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = y.data<float>()[i] != 0.f;
    ASSERT_EQ(kept, dx.data<float>()[i] != 0.f) << i;
    if (kept) {
      ASSERT_EQ(y.data<float>()[i], x.data<float>()[i] * scale);
      ASSERT_EQ(dx.data<float>()[i], dy.data<float>()[i] * scale);
    }
  }
  // Another offset (another dropout call site) draws another mask.
  Tensor y2 = ctx.empty({n}, DType::F32);
  ops::dropout_forward(ctx, y2, x, 0.3f, kSeed, kOffset + 1, 5);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (y.data<float>()[i] == 0.f) != (y2.data<float>()[i] == 0.f);
  EXPECT_GT(differ, n / 10);
}

// ---- finite differences (fp64, CPU): dropout is linear in x; bias-dropout-add in x, bias, residual ----
std::vector<GradCase> dropout_grad_cases() {
  std::vector<GradCase> cases;
  for (auto [r, h] : {std::pair<int64_t, int64_t>{1, 1}, {5, 9}, {3, 129}}) {
    GradCase c;
    c.name = str_cat("dropout_", r, "x", h);
    c.inputs = {TensorSpec{Shape{r, h}, DType::F64}};
    c.differentiable = {0};
    c.forward = [](Context& ctx, const std::vector<Tensor>& in) {
      Tensor y = ctx.empty(in[0].shape(), DType::F64);
      ops::dropout_forward(ctx, y, in[0], 0.3f, kSeed, kOffset, 2);
      return std::vector<Tensor>{y};
    };
    c.backward = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
      Tensor dx = ctx.empty(in[0].shape(), DType::F64);
      ops::dropout_backward(ctx, dx, g[0], 0.3f, kSeed, kOffset, 2);
      return std::vector<Tensor>{dx};
    };
    cases.push_back(c);

    GradCase b;
    b.name = str_cat("bias_dropout_add_", r, "x", h);
    b.inputs = {TensorSpec{Shape{r, h}, DType::F64}, TensorSpec{Shape{h}, DType::F64}, TensorSpec{Shape{r, h}, DType::F64}};
    b.differentiable = {0, 1, 2};
    b.forward = [](Context& ctx, const std::vector<Tensor>& in) {
      Tensor y = ctx.empty(in[0].shape(), DType::F64);
      ops::bias_dropout_add_forward(ctx, y, in[0], in[1], in[2], 0.3f, kSeed, kOffset, 2);
      return std::vector<Tensor>{y};
    };
    b.backward = [r, h](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
      Tensor dx = ctx.empty(in[0].shape(), DType::F64), dbias = ctx.empty({h}, DType::F64);
      ops::dropout_backward(ctx, dx, g[0], 0.3f, kSeed, kOffset, 2);
      for (int64_t c = 0; c < h; ++c) {
        double s = 0;
        for (int64_t i = 0; i < r; ++i) s += dx.data<double>()[i * h + c];
        dbias.data<double>()[c] = s;
      }
      return std::vector<Tensor>{dx, dbias, g[0]};
    };
    cases.push_back(b);
  }
  return cases;
}
MEGATRON_GRAD_CASES(Dropout, dropout_grad_cases);

// ---- bad input ----
TEST(DropoutBadInput, ProbabilityShapesDtypesDevice) {
  Context& ctx = testing::cpu_context();
  Tensor x = ctx.empty({4, 6}, DType::F32), y = ctx.empty({4, 6}, DType::F32);
  expect_error([&] { ops::dropout_forward(ctx, y, x, 1.5f, 1, 0); }, {"dropout_forward", "p", "1.5"});
  expect_error([&] { ops::dropout_forward(ctx, y, x, -0.1f, 1, 0); }, {"dropout_forward", "p"});
  expect_error([&] { ops::dropout_forward(ctx, y, x, NAN, 1, 0); }, {"dropout_forward", "p"});
  Tensor y_bad = ctx.empty({6, 4}, DType::F32), y_bf16 = ctx.empty({4, 6}, DType::BF16);
  expect_error([&] { ops::dropout_forward(ctx, y_bad, x, 0.1f, 1, 0); }, {"dropout_forward", "y", "[6, 4]", "[4, 6]"});
  expect_error([&] { ops::dropout_backward(ctx, y_bf16, x, 0.1f, 1, 0); }, {"dropout_backward", "dx", "bf16[4, 6]"});
  Tensor xi = ctx.empty({4}, DType::I32);
  expect_error([&] { ops::dropout_forward(ctx, xi, xi, 0.1f, 1, 0); }, {"dropout_forward", "x", "i32[4]"});
  Tensor bias_bad = ctx.empty({4}, DType::F32), res = ctx.empty({4, 6}, DType::F32);
  expect_error([&] { ops::bias_dropout_add_forward(ctx, y, x, bias_bad, res, 0.1f, 1, 0); },
               {"bias_dropout_add_forward", "bias", "f32[4]", "[6]"});
  expect_error([&] { ops::bias_dropout_add_forward(ctx, y, x, Tensor(), Tensor(), 0.1f, 1, 0); },
               {"bias_dropout_add_forward", "residual"});
  Tensor x_gpu = Tensor::from_blob(x.data_ptr(), Shape{4, 6}, DType::F32, Device::cuda(0));
  expect_error([&] { ops::dropout_forward(ctx, y, x_gpu, 0.1f, 1, 0); }, {"dropout_forward", "x", "cuda:0"});
}

}  // namespace
}  // namespace megatron
