// Tests of the qkv family: CUDA vs CPU for both directions over dtypes, MHA/GQA/MQA, RoPE layouts, partial
// rotation, offsets and unaligned views; the CPU reference against an independent composition (the packed
// layout indexed by hand in the test, then ops::rope_forward); the backward against finite differences;
// bad inputs.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/ops/qkv/qkv.h"

namespace megatron {
namespace {

using namespace megatron::testing;
using ops::RopeOptions;

struct Heads {
  int64_t B, S, G, R, D;
  Shape packed() const { return {B, S, G * (R + 2) * D}; }
  Shape q() const { return {B, S, G * R, D}; }
  Shape kv() const { return {B, S, G, D}; }
};

std::string heads_name(const Heads& h) { return str_cat(h.B, "x", h.S, "_g", h.G, "r", h.R, "d", h.D); }

std::string rope_name(const std::optional<RopeOptions>& o) {
  if (!o) return "_norope";
  std::string n = o->interleaved ? "_inter" : "_half";
  if (o->rotary_percent != 1.0) n += str_cat("_pct", int(o->rotary_percent * 100));
  if (o->position_offset != 0) n += str_cat("_off", o->position_offset);
  return n;
}

// unaligned: every input is a view one element into a larger buffer (defeats the vector path).
OpCase qkv_case(Heads h, DType dt, std::optional<RopeOptions> rope, bool backward, bool unaligned = false) {
  OpCase c;
  c.name = str_cat(backward ? "merge_" : "split_", dtype_name(dt), "_", heads_name(h), rope_name(rope),
                   unaligned ? "_unaligned" : "");
  auto in_spec = [&](const Shape& s) { return unaligned ? TensorSpec{Shape{s.numel() + 1}, dt} : TensorSpec{s, dt}; };
  auto in_view = [=](const Tensor& t, const Shape& s) { return unaligned ? t.slice(1, s.numel() + 1).view(s.dims()) : t; };
  if (backward) {
    c.inputs = {in_spec(h.q()), in_spec(h.kv()), in_spec(h.kv())};
    c.outputs = {{h.packed(), dt}};
  } else {
    c.inputs = {in_spec(h.packed())};
    c.outputs = {{h.q(), dt}, {h.kv(), dt}, {h.kv(), dt}};
  }
  c.run = [=](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    if (backward)
      ops::merge_qkv_backward(ctx, out[0], in_view(in[0], h.q()), in_view(in[1], h.kv()), in_view(in[2], h.kv()), rope);
    else
      ops::split_qkv_forward(ctx, out[0], out[1], out[2], in_view(in[0], h.packed()), rope);
  };
  return c;
}

std::vector<OpCase> qkv_cases() {
  RopeOptions half, inter, pct, offset;
  inter.interleaved = true;
  pct.rotary_percent = 0.5;
  offset.position_offset = 300;
  offset.base = 500000.0;
  const std::vector<Heads> shapes = {
      {1, 1, 1, 1, 2},      // the smallest
      {2, 7, 3, 1, 8},      // MHA
      {2, 5, 2, 3, 16},     // GQA
      {1, 9, 1, 4, 12},     // MQA, D not a multiple of the vector width
      {2, 33, 8, 2, 128},   // Llama-like
      {1, 129, 12, 1, 64},  // GPT-2-like
  };
  std::vector<OpCase> cases;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool bwd : {false, true}) {
      for (const Heads& h : shapes) {
        cases.push_back(qkv_case(h, dt, std::nullopt, bwd));
        cases.push_back(qkv_case(h, dt, half, bwd));
        cases.push_back(qkv_case(h, dt, inter, bwd));
      }
      cases.push_back(qkv_case({1, 9, 1, 4, 12}, dt, pct, bwd));  // rot 6: scalar path, tail
      cases.push_back(qkv_case({2, 17, 2, 2, 64}, dt, pct, bwd));
      cases.push_back(qkv_case({2, 17, 2, 2, 64}, dt, offset, bwd));
      cases.push_back(qkv_case({2, 9, 2, 2, 32}, dt, half, bwd, /*unaligned=*/true));
      cases.push_back(qkv_case({2, 9, 2, 2, 32}, dt, inter, bwd, /*unaligned=*/true));
    }
  return cases;
}
MEGATRON_OP_CASES(Qkv, qkv_cases);

// ---- the reference against an independent composition ----
Tensor random_cpu(const Shape& shape, const std::string& seed) {
  Tensor t = cpu_context().empty(shape, DType::F64);
  fill_random(t, seed_from(seed));
  return t;
}

TEST(QkvReference, SplitIsTheMegatronLayoutFollowedByRope) {
  Context& ctx = cpu_context();
  for (const Heads h : {Heads{2, 5, 2, 3, 8}, Heads{1, 4, 1, 1, 6}, Heads{1, 3, 4, 1, 4}})
    for (std::optional<RopeOptions> rope : {std::optional<RopeOptions>{}, std::optional<RopeOptions>{RopeOptions{}}}) {
      Tensor packed = random_cpu(h.packed(), "ref_packed");
      Tensor q = ctx.empty(h.q(), DType::F64), k = ctx.empty(h.kv(), DType::F64), v = ctx.empty(h.kv(), DType::F64);
      ops::split_qkv_forward(ctx, q, k, v, packed, rope);
      // Expected: query head g*R + i of token t is packed row (t, g, i); key (t, g, R); value (t, g, R + 1).
      Tensor eq = ctx.empty(h.q(), DType::F64), ek = ctx.empty(h.kv(), DType::F64), ev = ctx.empty(h.kv(), DType::F64);
      const double* p = packed.data<double>();
      for (int64_t t = 0; t < h.B * h.S; ++t)
        for (int64_t g = 0; g < h.G; ++g)
          for (int64_t d = 0; d < h.D; ++d) {
            auto at = [&](int64_t slot) { return p[((t * h.G + g) * (h.R + 2) + slot) * h.D + d]; };
            for (int64_t i = 0; i < h.R; ++i) eq.data<double>()[((t * h.G + g) * h.R + i) * h.D + d] = at(i);
            ek.data<double>()[(t * h.G + g) * h.D + d] = at(h.R);
            ev.data<double>()[(t * h.G + g) * h.D + d] = at(h.R + 1);
          }
      if (rope) {
        ops::rope_forward(ctx, eq, eq, *rope);
        ops::rope_forward(ctx, ek, ek, *rope);
      }
      for (auto [got, want] : {std::pair{q, eq}, std::pair{k, ek}, std::pair{v, ev}})
        for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<double>()[i], want.data<double>()[i]) << i;
    }
}

TEST(QkvReference, MergeUndoesSplit) {
  Context& ctx = cpu_context();
  const Heads h{2, 6, 2, 2, 8};
  RopeOptions o;
  o.position_offset = 3;
  Tensor packed = random_cpu(h.packed(), "undo");
  Tensor q = ctx.empty(h.q(), DType::F64), k = ctx.empty(h.kv(), DType::F64), v = ctx.empty(h.kv(), DType::F64);
  ops::split_qkv_forward(ctx, q, k, v, packed, o);
  Tensor back = ctx.empty(h.packed(), DType::F64);
  ops::merge_qkv_backward(ctx, back, q, k, v, o);  // rotations are orthogonal: the transpose is the inverse
  for (int64_t i = 0; i < packed.numel(); ++i) EXPECT_NEAR(back.data<double>()[i], packed.data<double>()[i], 1e-14);
}

// ---- finite differences: the merge is the transpose of the split ----
GradCase grad_case(Heads h, std::optional<RopeOptions> rope) {
  GradCase c;
  c.name = heads_name(h) + rope_name(rope);
  c.inputs = {{h.packed()}};
  c.differentiable = {0};
  c.forward = [=](Context& ctx, const std::vector<Tensor>& in) {
    Tensor q = ctx.empty(h.q(), DType::F64), k = ctx.empty(h.kv(), DType::F64), v = ctx.empty(h.kv(), DType::F64);
    ops::split_qkv_forward(ctx, q, k, v, in[0], rope);
    return std::vector<Tensor>{q, k, v};
  };
  c.backward = [=](Context& ctx, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
    Tensor d = ctx.empty(h.packed(), DType::F64);
    ops::merge_qkv_backward(ctx, d, g[0], g[1], g[2], rope);
    return std::vector<Tensor>{d};
  };
  return c;
}
std::vector<GradCase> grad_cases() {
  RopeOptions inter, pct;
  inter.interleaved = true;
  pct.rotary_percent = 0.5;
  return {grad_case({2, 3, 2, 2, 8}, std::nullopt), grad_case({1, 4, 2, 1, 8}, RopeOptions{}),
          grad_case({1, 3, 1, 3, 8}, inter), grad_case({2, 2, 1, 2, 8}, pct)};
}
MEGATRON_GRAD_CASES(Qkv, grad_cases);

// ---- bad inputs ----
TEST(QkvBadInput, ShapesDtypesAndOptions) {
  Context& ctx = cpu_context();
  const Heads h{2, 3, 2, 2, 8};
  Tensor packed = ctx.empty(h.packed(), DType::F32);
  Tensor q = ctx.empty(h.q(), DType::F32), k = ctx.empty(h.kv(), DType::F32), v = ctx.empty(h.kv(), DType::F32);
  expect_error([&] { ops::split_qkv_forward(ctx, q, k, v, ctx.empty({2, 3, 63}, DType::F32)); },
               {"split_qkv_forward", "qkv", "[2, 3, 63]", "[2, 3, 64]"});
  expect_error([&] { ops::split_qkv_forward(ctx, ctx.empty({2, 3, 3, 8}, DType::F32), k, v, packed); },
               {"split_qkv_forward", "multiple", "3", "2"});
  expect_error([&] { ops::split_qkv_forward(ctx, q, k, ctx.empty(h.kv(), DType::BF16), packed); },
               {"split_qkv_forward", "bf16"});
  expect_error([&] { ops::merge_qkv_backward(ctx, packed, q, ctx.empty({2, 4, 2, 8}, DType::F32), v); },
               {"merge_qkv_backward", "dk", "[2, 4, 2, 8]"});
  RopeOptions odd;
  odd.rotary_percent = 0.1;  // int(8 * 0.1) = 0 rotated channels
  expect_error([&] { ops::split_qkv_forward(ctx, q, k, v, packed, odd); }, {"split_qkv_forward", "even and positive"});
}

}  // namespace
}  // namespace megatron
