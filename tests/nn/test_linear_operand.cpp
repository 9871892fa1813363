// Produced operands (nn/linear_operand.h): an FP8 linear given SwiGLU's output (fc2's input) or SwiGLU's input gradient
// (fc1's output gradient) as the op that produces it must compute exactly what it computes from the stored tensor: the
// same output, input gradient, weight and bias gradients and recorded amaxes, bit for bit, for every recipe (delayed
// scaling fuses the op into its cast; the others materialise it) and with a bias (whose gradient needs the stored
// gradient). A layer in the parameter dtype materialises the operand. On the CPU in F32, and on the GPU in BF16, where
// delayed scaling runs the fused CUDA casts.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/row_parallel_linear.h"
#include "megatron/ops/activation/activation.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {
namespace {

using testing::to_doubles;

// F = 80: two 64-column pair tiles of the fused gradient cast, the second partial.
constexpr int64_t kRows = 48, kHidden = 64, kFfn = 80;

// A [shape] tensor of ctx with normal values of the given scale (made on the CPU, then copied).
Tensor random_tensor(Context& ctx, const Shape& shape, DType dtype, uint64_t seed, double scale) {
  Context& cpu = testing::cpu_context();
  Tensor f32 = cpu.empty(shape, DType::F32);
  testing::fill_normal(f32, seed, scale);
  Tensor host = cpu.empty(shape, dtype);
  ops::cast(cpu, host, f32);
  Tensor t = ctx.empty(shape, dtype);
  copy_tensor(ctx, t, host);
  return t;
}

struct Outcome {
  std::vector<double> y, dx, dw, db, state;
};

void expect_identical(const Outcome& produced, const Outcome& stored, const std::string& what) {
  EXPECT_EQ(produced.y, stored.y) << what << ": y";
  EXPECT_EQ(produced.dx, stored.dx) << what << ": dx";
  EXPECT_EQ(produced.dw, stored.dw) << what << ": the weight's main grad";
  EXPECT_EQ(produced.db, stored.db) << what << ": the bias's main grad";
  EXPECT_EQ(produced.state, stored.state) << what << ": the scaling state (recorded amaxes, scales)";
}

// `linear` in FP8 under `scaling` (null: left in its dtype), with its scaling state allocated.
template <class Linear>
std::shared_ptr<Fp8ScalingState> enable_fp8(Context& ctx, Linear& linear, const Fp8Scaling* scaling) {
  if (scaling == nullptr) return nullptr;
  auto state = std::make_shared<Fp8ScalingState>(Fp8Recipe{.enabled = true, .scaling = *scaling});
  linear.enable_fp8(state);
  state->allocate(ctx);
  return state;
}

// fc2 (row-parallel, F -> H) forward and backward, its input SwiGLU's output of `pre` [rows, 2F].
Outcome run_fc2(Context& ctx, DType dtype, const Fp8Scaling* scaling, bool bias, bool produced) {
  RowParallelLinear fc2(ctx, "mlp.linear_fc2", kFfn, kHidden, bias, dtype, {});
  fc2.init(ctx, 11, 0.2);
  const std::shared_ptr<Fp8ScalingState> state = enable_fp8(ctx, fc2, scaling);
  const Tensor pre = random_tensor(ctx, {kRows, 2 * kFfn}, dtype, 1, 2.0);
  const Tensor dy = random_tensor(ctx, {kRows, kHidden}, dtype, 2, 1.0);
  Tensor y = ctx.empty({kRows, kHidden}, dtype), dx = ctx.empty({kRows, kFfn}, dtype);
  LinearSaved saved;
  if (produced) {
    saved = fc2.forward(ctx, y, LinearOperand::swiglu(pre));
  } else {
    Tensor act = ctx.empty({kRows, kFfn}, dtype);
    ops::swiglu_forward(ctx, act, pre);
    saved = fc2.forward(ctx, y, act);
  }
  fc2.backward(ctx, std::move(saved), dx, dy);
  Outcome o{to_doubles(ctx, y), to_doubles(ctx, dx), to_doubles(ctx, fc2.weight.main_grad), {}, {}};
  if (bias) o.db = to_doubles(ctx, fc2.bias.main_grad);
  if (state) o.state = to_doubles(ctx, state->packed_linear_state(ctx, 0));
  return o;
}

// fc1 (column-parallel, H -> 2F) forward and backward, its output gradient SwiGLU's input gradient.
Outcome run_fc1(Context& ctx, DType dtype, const Fp8Scaling* scaling, bool bias, bool produced) {
  ColumnParallelLinear fc1(ctx, "mlp.linear_fc1", kHidden, 2 * kFfn, bias, dtype, {});
  fc1.init(ctx, 13, 0.2);
  const std::shared_ptr<Fp8ScalingState> state = enable_fp8(ctx, fc1, scaling);
  const Tensor x = random_tensor(ctx, {kRows, kHidden}, dtype, 3, 1.0);
  const Tensor dact = random_tensor(ctx, {kRows, kFfn}, dtype, 4, 1.0);
  Tensor pre = ctx.empty({kRows, 2 * kFfn}, dtype), dx = ctx.empty({kRows, kHidden}, dtype);
  LinearSaved saved = fc1.forward(ctx, pre, x);
  if (produced) {
    fc1.backward(ctx, std::move(saved), dx, LinearOperand::swiglu_grad(dact, pre));
  } else {
    Tensor dpre = ctx.empty({kRows, 2 * kFfn}, dtype);
    ops::swiglu_backward(ctx, dpre, dact, pre);
    fc1.backward(ctx, std::move(saved), dx, dpre);
  }
  Outcome o{to_doubles(ctx, pre), to_doubles(ctx, dx), to_doubles(ctx, fc1.weight.main_grad), {}, {}};
  if (bias) o.db = to_doubles(ctx, fc1.bias.main_grad);
  if (state) o.state = to_doubles(ctx, state->packed_linear_state(ctx, 0));
  return o;
}

void expect_produced_equals_stored(Context& ctx, DType dtype) {
  const Fp8Scaling recipes[] = {Fp8Scaling::Delayed, Fp8Scaling::Tensorwise, Fp8Scaling::Blockwise};
  for (bool bias : {false, true}) {
    for (const Fp8Scaling& s : recipes) {
      const std::string what = str_cat(dtype_name(dtype), " FP8 recipe ", int(s), bias ? " with bias" : "");
      expect_identical(run_fc2(ctx, dtype, &s, bias, true), run_fc2(ctx, dtype, &s, bias, false), "fc2 " + what);
      expect_identical(run_fc1(ctx, dtype, &s, bias, true), run_fc1(ctx, dtype, &s, bias, false), "fc1 " + what);
    }
    const std::string what = str_cat(dtype_name(dtype), " no FP8", bias ? " with bias" : "");
    expect_identical(run_fc2(ctx, dtype, nullptr, bias, true), run_fc2(ctx, dtype, nullptr, bias, false),
                     "fc2 " + what);
    expect_identical(run_fc1(ctx, dtype, nullptr, bias, true), run_fc1(ctx, dtype, nullptr, bias, false),
                     "fc1 " + what);
  }
}

TEST(LinearOperand, ProducedEqualsStoredOnTheCpu) { expect_produced_equals_stored(testing::cpu_context(), DType::F32); }

TEST(LinearOperand, MaterialiseRunsTheOp) {
  Context& ctx = testing::cpu_context();
  const Tensor pre = random_tensor(ctx, {5, 6}, DType::F32, 5, 1.0),
               dy = random_tensor(ctx, {5, 3}, DType::F32, 6, 1.0);
  Tensor act = ctx.empty({5, 3}, DType::F32), dpre = ctx.empty({5, 6}, DType::F32);
  ops::swiglu_forward(ctx, act, pre);
  ops::swiglu_backward(ctx, dpre, dy, pre);
  const LinearOperand fwd = LinearOperand::swiglu(pre), bwd = LinearOperand::swiglu_grad(dy, pre);
  EXPECT_EQ(fwd.rows(), 5);
  EXPECT_EQ(fwd.cols(), 3);
  EXPECT_EQ(bwd.cols(), 6);
  EXPECT_EQ(to_doubles(ctx, fwd.materialise(ctx)), to_doubles(ctx, act));
  EXPECT_EQ(to_doubles(ctx, bwd.materialise(ctx)), to_doubles(ctx, dpre));
  EXPECT_EQ(LinearOperand(pre).materialise(ctx).data_ptr(), pre.data_ptr()) << "a stored operand is not copied";
  testing::expect_error([&] { (void)LinearOperand::swiglu(ctx.empty({5, 7}, DType::F32)); }, {"swiglu", "[rows, 2F]"});
  testing::expect_error(
      [&] {
        (void)LinearOperand::swiglu_grad(dy, ctx.empty({5, 8}, DType::F32));
      },
      {"swiglu_grad", "[rows, F]"});
  testing::expect_error([&] { (void)fwd.tensor(); }, {"materialise"});
}

TEST(LinearOperandGpu, ProducedEqualsStoredWithTheFusedCasts) {
  MEGATRON_REQUIRE_GPU();
  expect_produced_equals_stored(testing::cuda_context(), DType::BF16);
}

}  // namespace
}  // namespace megatron::nn
