// Tests of the fused SwiGLU casts (ops/fp8/fp8.h): fp8_swiglu_cast_transpose must give exactly the codes and amax of
// swiglu_forward followed by fp8_cast_transpose, and fp8_swiglu_grad_cast_transpose those of swiglu_backward followed
// by the cast (both ops are tested against their own references elsewhere). On the CPU the fused op is that
// composition; on CUDA it is one kernel, checked here bit for bit against the two CUDA ops on the vector path (aligned,
// F a multiple of the vector width: tiles straddling F, partial tiles, rows not a multiple of 16) and on the fallback
// (unaligned views, odd F), for every selection of outputs, and against the CPU within one code where the two backends'
// SwiGLU differ by an ulp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/ops/activation/activation.h"
#include "megatron/ops/fp8/fp8.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using enum DType;

Context& cpu() { return testing::cpu_context(); }

// Values of both signs over [-12, 12] (sigmoid's tails and its middle), and, with `specials`, NaN, +-inf and +-0 at
// every 29th element.
Tensor random_values(const Shape& shape, DType dtype, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-12.0, 12.0);
  const double kSpecial[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0};
  Tensor t = cpu().empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = specials && i % 29 == 11 ? kSpecial[(i / 29) % 5] : u(rng);
    switch (dtype) {
      case F64:
        t.data<double>()[i] = v;
        break;
      case F32:
        t.data<float>()[i] = float(v);
        break;
      case BF16:
        t.data<bf16_t>()[i] = from_float<bf16_t>(float(v));
        break;
      default:
        t.data<fp16_t>()[i] = from_float<fp16_t>(float(v));
        break;
    }
  }
  return t;
}

std::vector<uint8_t> bytes_of(Context& ctx, const Tensor& t) {
  if (!t.defined()) return {};
  Tensor h = cpu().empty(t.shape(), t.dtype());
  copy_tensor(ctx, h, t);
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}
Tensor scalar_on(Context& ctx, float v) {
  Tensor h = cpu().empty(Shape{1}, F32);
  h.data<float>()[0] = v;
  return testing::copy_on(ctx, h);
}

struct Request {
  bool grad = false;  // the backward's cast, else the forward's
  DType fp8 = F8E4M3;
  float scale = 1.0f;
  float amax_start = 0.0f;
  bool want_out = true, want_out_t = true, want_amax = true;
  bool unaligned = false;
};
struct Result {
  std::vector<uint8_t> out, out_t, amax;
};

std::string describe(const Tensor& x, const Request& q) {
  return str_cat(q.grad ? "swiglu_grad " : "swiglu ", x.describe(), " -> ", dtype_name(q.fp8), " scale ", q.scale,
                 q.want_out ? " out" : "", q.want_out_t ? " out_t" : "", q.want_amax ? " amax" : "",
                 q.unaligned ? " unaligned" : "");
}

// The fused op (fused = true) or the activation op then the cast, on ctx, from host inputs x [rows, 2F] and dy [rows,
// F].
Result run(Context& ctx, const Tensor& host_x, const Tensor& host_dy, const Request& q, bool fused) {
  const int64_t rows = host_x.dim(0), f = host_x.dim(1) / 2, cols = q.grad ? 2 * f : f;
  const Tensor x = testing::copy_on(ctx, host_x, q.unaligned), dy = testing::copy_on(ctx, host_dy, q.unaligned);
  Tensor out = q.want_out ? ctx.empty(Shape{rows, cols}, q.fp8) : Tensor();
  Tensor out_t = q.want_out_t ? ctx.empty(Shape{cols, rows}, q.fp8) : Tensor();
  if (out.defined()) testing::poison(ctx, out);
  if (out_t.defined()) testing::poison(ctx, out_t);
  Tensor amax = q.want_amax ? scalar_on(ctx, q.amax_start) : Tensor();
  const Tensor scale = scalar_on(ctx, q.scale);
  if (fused && q.grad) {
    ops::fp8_swiglu_grad_cast_transpose(ctx, out, out_t, amax, dy, x, scale);
  } else if (fused) {
    ops::fp8_swiglu_cast_transpose(ctx, out, out_t, amax, x, scale);
  } else {
    Tensor act = ctx.empty(Shape{rows, cols}, host_x.dtype());
    if (q.grad)
      ops::swiglu_backward(ctx, act, dy, x);
    else
      ops::swiglu_forward(ctx, act, x);
    ops::fp8_cast_transpose(ctx, out, out_t, amax, act, scale);
  }
  return Result{bytes_of(ctx, out), bytes_of(ctx, out_t), bytes_of(ctx, amax)};
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(got.out, want.out) << what << ": out";
  EXPECT_EQ(got.out_t, want.out_t) << what << ": out_t";
  EXPECT_EQ(got.amax, want.amax) << what << ": amax bits";
}

// ---------------------------------------------------------------- CPU

TEST(Fp8SwigluCast, EqualsTheActivationThenTheCast) {
  uint64_t seed = 1;
  for (DType dt : {F64, F32, BF16, F16})
    for (bool grad : {false, true})
      for (const Shape& s : {Shape{1, 2}, Shape{5, 6}, Shape{37, 258}}) {
        const Tensor x = random_values(s, dt, seed++, true),
                     dy = random_values(Shape{s[0], s[1] / 2}, dt, seed++, false);
        for (const Request& q : {Request{.grad = grad, .fp8 = F8E4M3, .scale = 37.5f},
                                 Request{.grad = grad, .fp8 = F8E5M2, .scale = 0.25f, .amax_start = 3.0f},
                                 Request{.grad = grad, .want_out = false, .want_amax = false}}) {
          const Result fused = run(cpu(), x, dy, q, true), two_ops = run(cpu(), x, dy, q, false);
          expect_same(fused, two_ops, describe(x, q));
          if (q.want_out) {
            EXPECT_EQ(std::count(fused.out.begin(), fused.out.end(), 0xFF), 0) << "unwritten codes";
          }
        }
      }
}

TEST(Fp8SwigluCast, RejectsBadArguments) {
  Context& c = cpu();
  const Tensor x = c.empty(Shape{4, 6}, BF16), dy = c.empty(Shape{4, 3}, BF16), scale = scalar_on(c, 1.0f);
  expect_error(
      [&] {
        ops::fp8_swiglu_cast_transpose(c, c.empty(Shape{4, 3}, F8E4M3), Tensor(), Tensor(), c.empty(Shape{4, 5}, BF16),
                                       scale);
      },
      {"fp8_swiglu_cast_transpose", "last dimension is odd"});
  expect_error(
      [&] {
        ops::fp8_swiglu_cast_transpose(c, c.empty(Shape{4, 6}, F8E4M3), Tensor(), Tensor(), x, scale);
      },
      {"argument out", "must have shape [4, 3]"});
  expect_error([&] { ops::fp8_swiglu_cast_transpose(c, Tensor(), Tensor(), Tensor(), x, scale); },
               {"at least one of out and out_t"});
  expect_error(
      [&] {
        ops::fp8_swiglu_grad_cast_transpose(c, c.empty(Shape{4, 6}, F8E4M3), Tensor(), Tensor(),
                                            c.empty(Shape{4, 6}, BF16), x, scale);
      },
      {"fp8_swiglu_grad_cast_transpose", "argument dy", "must have shape [4, 3]"});
  expect_error(
      [&] {
        ops::fp8_swiglu_grad_cast_transpose(c, c.empty(Shape{4, 6}, F8E4M3), Tensor(), Tensor(),
                                            c.empty(Shape{4, 3}, F32), x, scale);
      },
      {"fp8_swiglu_grad_cast_transpose", "dy"});
  expect_error(
      [&] {
        ops::fp8_swiglu_grad_cast_transpose(c, Tensor(), c.empty(Shape{4, 6}, F8E5M2), Tensor(), dy, x, scale);
      },
      {"argument out_t", "must have shape [6, 4]"});
}

// ---------------------------------------------------------------- CUDA

// F: multiples of 8 (bf16/f16 vectors) straddling 128-column tiles or not, 4 only (f32 vectors), odd (the fallback);
// rows: partial tiles and rows % 16 != 0 (byte stores of out_t).
const Shape kGpuShapes[] = {Shape{16, 32},   Shape{48, 272}, Shape{130, 64}, Shape{300, 136},
                            Shape{256, 512}, Shape{64, 24},  Shape{20, 10},  Shape{512, 2048}};

TEST(Fp8SwigluCastGpu, BitIdenticalToTheActivationThenTheCast) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  uint64_t seed = 1000;
  for (DType dt : {BF16, F16, F32})
    for (bool grad : {false, true})
      for (const Shape& s : kGpuShapes) {
        const Tensor x = random_values(s, dt, seed++, s[0] == 48);
        const Tensor dy = random_values(Shape{s[0], s[1] / 2}, dt, seed++, false);
        for (const Request& q : {Request{.grad = grad, .fp8 = F8E4M3, .scale = 37.5f},
                                 Request{.grad = grad, .fp8 = F8E5M2, .scale = 1.0f / 8, .amax_start = 1.5f},
                                 Request{.grad = grad, .fp8 = F8E4M3, .want_out_t = false},
                                 Request{.grad = grad, .fp8 = F8E5M2, .want_out = false, .want_amax = false},
                                 Request{.grad = grad, .fp8 = F8E4M3, .scale = 2.0f, .unaligned = true}}) {
          const Result fused = run(gpu, x, dy, q, true);
          expect_same(fused, run(gpu, x, dy, q, false), describe(x, q));
          // The CPU's SwiGLU may round an element one ulp apart from CUDA's: at most one code off, rarely.
          const Result host = run(cpu(), x, dy, q, true);
          int64_t apart = 0;
          for (size_t i = 0; i < fused.out.size() && i < host.out.size(); ++i) {
            if (fused.out[i] == host.out[i]) continue;
            ++apart;
            EXPECT_LE(std::abs(int(fused.out[i]) - int(host.out[i])), 1) << describe(x, q) << ": out[" << i << "]";
          }
          EXPECT_LE(apart, int64_t(fused.out.size() / 100 + 1)) << describe(x, q) << ": codes apart from the CPU's";
        }
      }
}

TEST(Fp8SwigluCastGpu, LargeTensorAmaxOverAllBlocks) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  // The 8B's MLP at 512 tokens: 112 column tiles of the forward, 224 of the gradient, per row of tiles.
  const Tensor x = random_values(Shape{512, 28672}, BF16, 7, false);
  const Tensor dy = random_values(Shape{512, 14336}, BF16, 8, false);
  for (bool grad : {false, true}) {
    const Request q{.grad = grad, .fp8 = grad ? F8E5M2 : F8E4M3, .scale = 4.0f};
    expect_same(run(gpu, x, dy, q, true), run(gpu, x, dy, q, false), describe(x, q));
  }
}

}  // namespace
}  // namespace megatron
