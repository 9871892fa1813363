// The FP8 linear (nn/fp8_linear.h) against an fp64 reference with explicit quantisation, on the CPU's FP8
// emulation: for both formats and both recipes, with and without bias and with the GELU paths, the forward
// and both backward GEMMs equal  y = Q(x) Q(W)^T + b,  dx = Q(dy) Q(W),  dW += Q(dy)^T Q(x)  where
// Q(t) = fp8(t * s) / s with the recipe's scale s (delayed: the state's; tensorwise: fp8_max / amax(t);
// blockwise: per block, the largest power of two not above fp8_max / amax(block), with x and dy quantised
// in 1 x 128 blocks along the dimension each GEMM reduces -- rows of x and dy for y and dx, columns of them
// for dW -- and W in 128 x 128 blocks); delayed scaling records max |t| of each tensor into its history slot and turns it into the next scale at
// the end of the iteration (Transformer Engine's formulas, written out here).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <memory>

#include "harness.h"
#include "megatron/core/float_types.h"
#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/row_parallel_linear.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::nn {
namespace {

using testing::cpu_context;
using testing::to_doubles;

constexpr int64_t kRows = 32, kIn = 48, kOut = 32;

// fp8(v * scale) widened and multiplied by the inverse scale, as the FP8 GEMM dequantises (fp32 product).
double quantized(double v, float scale, DType fp8) {
  const float scaled = float(v) * scale;
  const float q = fp8 == DType::F8E4M3 ? to_float(fp8e4m3_from_float(scaled)) : to_float(fp8e5m2_from_float(scaled));
  return double(q) * double(1.0f / scale);
}

double amax_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<double> quantize_all(const std::vector<double>& v, float scale, DType fp8) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = quantized(v[i], scale, fp8);
  return out;
}

// Blockwise scaling's quantisation of a [rows, cols] tensor: blocks of block_rows x block_cols, each with the
// largest power of two not above fp8_max / amax(block) (1 for an all-zero block).
std::vector<double> block_quantize(const std::vector<double>& v, int64_t rows, int64_t cols, int64_t block_rows,
                                   int64_t block_cols, DType fp8) {
  std::vector<double> out(v.size());
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows)
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const int64_t r1 = std::min(rows, r0 + block_rows), c1 = std::min(cols, c0 + block_cols);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(float(v[size_t(r * cols + c)])));
      float scale = 1.0f;
      if (amax > 0) {
        int e = 0;
        std::frexp(fp8_max(fp8) / amax, &e);
        scale = std::ldexp(1.0f, e - 1);
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[size_t(r * cols + c)] = quantized(v[size_t(r * cols + c)], scale, fp8);
    }
  return out;
}

// The scale the recipe casts a tensor with: delayed scaling's preset, or current scaling's fp8_max / amax.
float recipe_scale(const Fp8Recipe& r, float delayed, const std::vector<double>& t, DType fp8) {
  if (r.scaling == Fp8Scaling::Delayed) return delayed;
  return fp8_max(fp8) / float(amax_of(t));
}

Tensor host_tensor(Context& ctx, Shape shape, uint64_t seed, double scale) {
  Tensor t = ctx.empty(std::move(shape), DType::F32);
  testing::fill_normal(t, seed, scale);
  return t;
}

// a [m, k] (row-major) times b^T for b [n, k] (transpose_b) or b [k, n].
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k, int64_t n,
                           bool transpose_b) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[size_t(i * k + p)] * (transpose_b ? b[size_t(j * k + p)] : b[size_t(p * n + j)]);
      c[size_t(i * n + j)] = s;
    }
  return c;
}

std::vector<double> transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0, scale = amax_of(want);
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, tol * scale) << what << ": max |got - want| " << worst << " against max |want| " << scale;
}

// Presets delayed scaling's scales (input, weight, output gradient) so that the casts saturate some elements.
void preset_scales(Context& ctx, Fp8ScalingState& state, const float (&scales)[3]) {
  const int64_t len = state.recipe().amax_history_len;
  Tensor packed = ctx.empty({len + 2, 3}, DType::F32);
  float* p = packed.data<float>();
  for (int64_t i = 0; i < (len + 2) * 3; ++i) p[i] = 0.0f;
  for (int c = 0; c < 3; ++c) {
    p[len * 3 + c] = scales[c];
    p[(len + 1) * 3 + c] = 1.0f / scales[c];
  }
  state.unpack_linear_state(ctx, 0, packed);
}

struct Case {
  Fp8Format format;
  Fp8Scaling scaling;
  bool bias;
  bool gelu;  // column: GELU fused into the forward; row: the GELU's backward fused into dx
};

std::string case_name(const Case& c) {
  const char* scaling = c.scaling == Fp8Scaling::Delayed      ? " delayed"
                        : c.scaling == Fp8Scaling::Tensorwise ? " tensorwise"
                                                              : " blockwise";
  return str_cat(c.format == Fp8Format::E4M3 ? "e4m3" : "hybrid", scaling, c.bias ? " bias" : "", c.gelu ? " gelu" : "");
}

// The linear's shape: small for the per-tensor recipes; for blockwise, several 128-blocks with partial ones
// at the ends of every dimension.
struct Dims {
  int64_t rows, in, out;
};
Dims dims_for(const Case& c) {
  if (c.scaling == Fp8Scaling::Blockwise) return {160, 272, 144};
  return {kRows, kIn, kOut};
}

const std::vector<Case> kCases = [] {
  std::vector<Case> out;
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::Hybrid})
    for (Fp8Scaling s : {Fp8Scaling::Delayed, Fp8Scaling::Tensorwise, Fp8Scaling::Blockwise})
      for (bool bias : {false, true})
        for (bool gelu : {false, true}) out.push_back({f, s, bias, gelu});
  return out;
}();

double gelu_grad(double x) { return ops::gelu_tanh_grad(x); }
double gelu(double x) { return ops::gelu_tanh(x); }

// What one FP8 linear's GEMMs must give, from the double values of its tensors: the dequantised operands of
// each GEMM (the per-tensor recipes quantise x and dy once; blockwise quantises them per GEMM).
struct Reference {
  std::vector<double> xq, wq, dyq;  // y = xq wq^T, dx = dyq wq
  std::vector<double> xq_w, dyq_w;  // dW = dyq_w^T xq_w
};

Reference quantize_operands(const Fp8Recipe& r, const float (&preset)[3], const std::vector<double>& x,
                            const std::vector<double>& w, const std::vector<double>& dy, const Dims& d) {
  Reference ref;
  if (r.scaling == Fp8Scaling::Blockwise) {
    ref.xq = block_quantize(x, d.rows, d.in, 1, 128, r.forward_dtype());
    ref.xq_w = block_quantize(x, d.rows, d.in, 128, 1, r.forward_dtype());
    ref.wq = block_quantize(w, d.out, d.in, 128, 128, r.forward_dtype());
    ref.dyq = block_quantize(dy, d.rows, d.out, 1, 128, r.grad_dtype());
    ref.dyq_w = block_quantize(dy, d.rows, d.out, 128, 1, r.grad_dtype());
    return ref;
  }
  ref.xq = quantize_all(x, recipe_scale(r, preset[0], x, r.forward_dtype()), r.forward_dtype());
  ref.wq = quantize_all(w, recipe_scale(r, preset[1], w, r.forward_dtype()), r.forward_dtype());
  ref.dyq = quantize_all(dy, recipe_scale(r, preset[2], dy, r.grad_dtype()), r.grad_dtype());
  ref.xq_w = ref.xq;
  ref.dyq_w = ref.dyq;
  return ref;
}

// Delayed scaling: the iteration recorded max |t| of each tensor, and end_iteration turns them into
// scale = fp8_max / amax (margin 0), scale_inv = 1 / scale, with the history (length 1) zeroed.
void expect_delayed_bookkeeping(Context& ctx, Fp8ScalingState& state, const std::vector<double>& x,
                                const std::vector<double>& w, const std::vector<double>& dy) {
  const double amax[3] = {amax_of(x), amax_of(w), amax_of(dy)};
  std::vector<double> packed = to_doubles(ctx, state.packed_linear_state(ctx, 0));
  for (int c = 0; c < 3; ++c) EXPECT_EQ(packed[size_t(c)], double(float(amax[c]))) << "recorded amax, column " << c;
  state.end_iteration(ctx, nullptr);
  packed = to_doubles(ctx, state.packed_linear_state(ctx, 0));
  const DType dtypes[3] = {state.recipe().forward_dtype(), state.recipe().forward_dtype(), state.recipe().grad_dtype()};
  for (int c = 0; c < 3; ++c) {
    const float scale = fp8_max(dtypes[c]) / float(amax[c]);
    EXPECT_EQ(packed[size_t(c)], 0.0) << "history slot not zeroed after the update, column " << c;
    EXPECT_EQ(packed[size_t(3 + c)], double(scale)) << "scale, column " << c;
    EXPECT_EQ(packed[size_t(6 + c)], double(1.0f / scale)) << "inverse scale, column " << c;
  }
  EXPECT_EQ(state.cast_weight(0), nullptr) << "the weight's FP8 copy must be dropped at the end of the iteration";
}

class Fp8LinearTest : public ::testing::TestWithParam<Case> {};

// Column-parallel linear (TP = 1): forward with the optional fused GELU, both backward GEMMs.
TEST_P(Fp8LinearTest, ColumnLinearMatchesExplicitQuantisation) {
  const Case c = GetParam();
  const Dims d = dims_for(c);
  Context& ctx = cpu_context();
  const Fp8Recipe recipe{.enabled = true, .format = c.format, .scaling = c.scaling};
  auto state = std::make_shared<Fp8ScalingState>(recipe);
  ColumnParallelLinear lin(ctx, "layer.fc", d.in, d.out, c.bias, DType::F32, {});
  lin.init(ctx, 7, 0.3);
  if (c.bias) testing::fill_normal(lin.bias.value, 3, 0.5);
  lin.enable_fp8(state);
  state->allocate(ctx);
  // Delayed scaling's preset scales saturate some elements of every tensor (|x| > 448 / 300, ...).
  const float preset[3] = {300.0f, 1500.0f, c.format == Fp8Format::E4M3 ? 300.0f : 20000.0f};
  if (c.scaling == Fp8Scaling::Delayed) preset_scales(ctx, *state, preset);
  const Tensor x = host_tensor(ctx, {d.rows, d.in}, 1, 1.0), dy = host_tensor(ctx, {d.rows, d.out}, 2, 1.0);
  Tensor y = ctx.empty({d.rows, d.out}, DType::F32), pre = c.gelu ? ctx.empty({d.rows, d.out}, DType::F32) : Tensor();
  Tensor dx = ctx.empty({d.rows, d.in}, DType::F32);
  const std::vector<double> w = to_doubles(ctx, lin.weight.value);
  lin.backward(ctx, lin.forward(ctx, y, x, pre), dx, dy);

  const std::vector<double> xs = to_doubles(ctx, x), dys = to_doubles(ctx, dy);
  const Reference r = quantize_operands(recipe, preset, xs, w, dys, d);
  std::vector<double> want_pre = matmul(r.xq, r.wq, d.rows, d.in, d.out, true);
  if (c.bias) {
    const std::vector<double> b = to_doubles(ctx, lin.bias.value);
    for (int64_t i = 0; i < d.rows * d.out; ++i)  // the bias enters an FP8 GEMM in bf16
      want_pre[size_t(i)] += double(to_float(bf16_from_float(float(b[size_t(i % d.out)]))));
  }
  std::vector<double> want_y = want_pre;
  if (c.gelu) {
    for (double& v : want_y) v = gelu(v);
    expect_close(to_doubles(ctx, pre), want_pre, 1e-5, "pre-activation");
  }
  expect_close(to_doubles(ctx, y), want_y, 1e-5, "y");
  expect_close(to_doubles(ctx, dx), matmul(r.dyq, r.wq, d.rows, d.out, d.in, false), 1e-5, "dx");
  expect_close(to_doubles(ctx, lin.weight.main_grad), matmul(transpose(r.dyq_w, d.rows, d.out), r.xq_w, d.out, d.rows, d.in, false),
               1e-5, "dW");
  if (c.bias) {
    std::vector<double> db(size_t(d.out), 0.0);
    for (int64_t i = 0; i < d.rows * d.out; ++i) db[size_t(i % d.out)] += dys[size_t(i)];
    expect_close(to_doubles(ctx, lin.bias.main_grad), db, 1e-5, "db (from the unquantised dy)");
  }
  if (c.scaling == Fp8Scaling::Delayed) expect_delayed_bookkeeping(ctx, *state, xs, w, dys);
}

// Row-parallel linear (TP = 1) with the GELU's backward fused into dx: dx = (Q(dy) Q(W)) * gelu'(pre).
TEST_P(Fp8LinearTest, RowLinearMatchesExplicitQuantisation) {
  const Case c = GetParam();
  const Dims d = dims_for(c);
  Context& ctx = cpu_context();
  const Fp8Recipe recipe{.enabled = true, .format = c.format, .scaling = c.scaling};
  auto state = std::make_shared<Fp8ScalingState>(recipe);
  RowParallelLinear lin(ctx, "layer.proj", d.in, d.out, c.bias, DType::F32, {});
  lin.init(ctx, 9, 0.2);
  lin.enable_fp8(state);
  state->allocate(ctx);
  const float preset[3] = {100.0f, 2000.0f, c.format == Fp8Format::E4M3 ? 150.0f : 9000.0f};
  if (c.scaling == Fp8Scaling::Delayed) preset_scales(ctx, *state, preset);
  const Tensor x = host_tensor(ctx, {d.rows, d.in}, 4, 2.0), dy = host_tensor(ctx, {d.rows, d.out}, 5, 1.0);
  const Tensor pre = c.gelu ? host_tensor(ctx, {d.rows, d.in}, 6, 1.5) : Tensor();
  Tensor y = ctx.empty({d.rows, d.out}, DType::F32), dx = ctx.empty({d.rows, d.in}, DType::F32);
  const std::vector<double> w = to_doubles(ctx, lin.weight.value);
  lin.backward(ctx, lin.forward(ctx, y, x), dx, dy, pre);

  const std::vector<double> xs = to_doubles(ctx, x), dys = to_doubles(ctx, dy);
  const Reference r = quantize_operands(recipe, preset, xs, w, dys, d);
  expect_close(to_doubles(ctx, y), matmul(r.xq, r.wq, d.rows, d.in, d.out, true), 1e-5, "y");
  std::vector<double> want_dx = matmul(r.dyq, r.wq, d.rows, d.out, d.in, false);
  if (c.gelu) {
    const std::vector<double> p = to_doubles(ctx, pre);
    for (size_t i = 0; i < want_dx.size(); ++i) want_dx[i] *= gelu_grad(p[i]);
  }
  expect_close(to_doubles(ctx, dx), want_dx, 1e-5, "dx");
  expect_close(to_doubles(ctx, lin.weight.main_grad), matmul(transpose(r.dyq_w, d.rows, d.out), r.xq_w, d.out, d.rows, d.in, false),
               1e-5, "dW");
  if (c.scaling == Fp8Scaling::Delayed) expect_delayed_bookkeeping(ctx, *state, xs, w, dys);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8LinearTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = case_name(info.param);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Evaluation casts with the training scales but records nothing; the weight is cast once per iteration.
TEST(Fp8Linear, EvaluationRecordsNoAmaxAndTheWeightIsCastOnce) {
  Context& ctx = cpu_context();
  auto state = std::make_shared<Fp8ScalingState>(Fp8Recipe{.enabled = true});
  ColumnParallelLinear lin(ctx, "layer.fc", kIn, kOut, false, DType::F32, {});
  lin.init(ctx, 7, 0.3);
  lin.enable_fp8(state);
  state->allocate(ctx);
  const Tensor x = host_tensor(ctx, {kRows, kIn}, 1, 1.0);
  Tensor y = ctx.empty({kRows, kOut}, DType::F32);
  state->set_recording(false);
  (void)lin.forward(ctx, y, x);
  EXPECT_EQ(to_doubles(ctx, state->packed_linear_state(ctx, 0))[0], 0.0) << "evaluation recorded an amax";
  const Fp8CastWeight* cast = state->cast_weight(0);
  ASSERT_NE(cast, nullptr);
  state->set_recording(true);
  (void)lin.forward(ctx, y, x);
  EXPECT_EQ(state->cast_weight(0), cast) << "the weight was cast again within the iteration";
}

// cuBLASLt's FP8 GEMMs need multiples of 16: a token count that is not is refused with the layer's name.
TEST(Fp8Linear, RefusesRowsThatAreNotAMultipleOf16) {
  Context& ctx = cpu_context();
  auto state = std::make_shared<Fp8ScalingState>(Fp8Recipe{.enabled = true});
  ColumnParallelLinear lin(ctx, "decoder.layers.0.mlp.linear_fc1", kIn, kOut, false, DType::F32, {});
  lin.init(ctx, 7, 0.3);
  lin.enable_fp8(state);
  state->allocate(ctx);
  const Tensor x = host_tensor(ctx, {24, kIn}, 1, 1.0);
  Tensor y = ctx.empty({24, kOut}, DType::F32);
  testing::expect_error([&] { (void)lin.forward(ctx, y, x); },
                        {"decoder.layers.0.mlp.linear_fc1", "token rows = 24", "multiple of 16"});
}

}  // namespace
}  // namespace megatron::nn
