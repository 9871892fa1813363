// optimizer family: AdamW (CUDA vs CPU on many tensors of odd sizes and mixed dtypes; the CPU against the
// AdamW formula written out here), the multi-tensor L2 norm (vs a double sum; bitwise deterministic on the
// GPU), multi_tensor_scale with found_inf (planted inf/NaN), bad inputs.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "harness.h"
#include "megatron/ops/optimizer/optimizer.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using ops::AdamParamGroupTensors;
using ops::AdamWConfig;
using testing::OpCase;
using testing::TensorSpec;

// ---- AdamW: CUDA vs CPU ----

struct AdamEntry {
  int64_t n;
  DType grad;
  std::optional<DType> model;
  std::optional<float> weight_decay;
};

// Inputs per entry: master, exp_avg, exp_avg_sq, grad. Outputs per entry: master, exp_avg, exp_avg_sq
// (starting as the inputs), then model_param if any.
OpCase adam_case(const std::string& name, const std::vector<AdamEntry>& entries, const AdamWConfig& config,
                 double grad_range) {
  OpCase c;
  c.name = name;
  std::vector<int> model_out;  // output index of each entry's model param, or -1
  for (const AdamEntry& e : entries) {
    const int base_in = int(c.inputs.size()), base_out = int(c.outputs.size());
    c.inputs.push_back(TensorSpec{{e.n}, DType::F32, -1, 1});
    c.inputs.push_back(TensorSpec{{e.n}, DType::F32, -0.1, 0.1});
    c.inputs.push_back(TensorSpec{{e.n}, DType::F32, 0, 0.01});
    c.inputs.push_back(TensorSpec{{e.n}, e.grad, -grad_range, grad_range});
    for (int k = 0; k < 3; ++k) {
      c.outputs.push_back(TensorSpec{{e.n}, DType::F32});
      c.output_starts_as_input.push_back({base_out + k, base_in + k});
      c.max_nmse.push_back(1e-12);
    }
    if (e.model) {
      model_out.push_back(int(c.outputs.size()));
      c.outputs.push_back(TensorSpec{{e.n}, *e.model});
      c.max_nmse.push_back(0);
    } else {
      model_out.push_back(-1);
    }
  }
  c.run = [entries, model_out, config](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    std::vector<AdamParamGroupTensors> groups;
    int o = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      AdamParamGroupTensors g;
      g.param = out[size_t(o)];
      g.exp_avg = out[size_t(o) + 1];
      g.exp_avg_sq = out[size_t(o) + 2];
      g.grad = in[4 * i + 3];
      if (model_out[i] >= 0) g.model_param = out[size_t(model_out[i])];
      g.weight_decay = entries[i].weight_decay;
      groups.push_back(g);
      o += 3 + (model_out[i] >= 0 ? 1 : 0);
    }
    ops::adamw_step(ctx, groups, config);
  };
  return c;
}

std::vector<OpCase> adam_cases() {
  const std::vector<AdamEntry> mixed = {
      {1, DType::F32, DType::BF16, std::nullopt},     {7, DType::BF16, DType::BF16, 0.0f},
      {129, DType::F32, std::nullopt, std::nullopt},  {100003, DType::BF16, DType::BF16, std::nullopt},
      {4096, DType::F16, DType::F16, 0.5f},           {5000, DType::F32, DType::F32, std::nullopt},
      {100003, DType::F32, DType::F16, std::nullopt}, {33, DType::F16, std::nullopt, 0.0f}};
  std::vector<OpCase> cases;
  AdamWConfig first;
  first.lr = 1e-3f;
  first.weight_decay = 0.1f;
  cases.push_back(adam_case("adamw_step1", mixed, first, 1.0));
  AdamWConfig later;
  later.lr = 3e-4f;
  later.beta2 = 0.95f;
  later.eps = 1e-6f;
  later.weight_decay = 0.01f;
  later.step = 1000;
  later.grad_scale = 1.f / 1024;
  cases.push_back(adam_case("adamw_step1000_scaled", mixed, later, 1024.0));
  // Many tensors: several batches per dtype group.
  std::vector<AdamEntry> many;
  for (int i = 0; i < 150; ++i)
    many.push_back({int64_t((i * 37) % 301 + 1), i % 3 == 0 ? DType::F32 : DType::BF16,
                    i % 5 == 0 ? std::nullopt : std::optional<DType>(DType::BF16),
                    i % 4 == 0 ? std::optional<float>(0.f) : std::nullopt});
  AdamWConfig mid = first;
  mid.step = 17;
  cases.push_back(adam_case("adamw_150_tensors", many, mid, 1.0));
  return cases;
}

// ---- L2 norm and scale: CUDA vs CPU ----

OpCase norm_case(const std::string& name, const std::vector<std::pair<int64_t, DType>>& tensors) {
  OpCase c;
  c.name = name;
  for (auto [n, d] : tensors) c.inputs.push_back(TensorSpec{{n}, d, -2, 2});
  c.outputs = {TensorSpec{{1}, DType::F32}, TensorSpec{{int64_t(tensors.size())}, DType::F32}};
  c.max_nmse = {1e-12, 1e-12};
  c.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    ops::multi_tensor_l2_norm(ctx, out[0], out[1], in);
  };
  return c;
}

OpCase scale_case(const std::string& name, const std::vector<std::pair<DType, DType>>& dtypes,
                  const std::vector<int64_t>& sizes, float scale, bool in_place, DType flag_dtype) {
  OpCase c;
  c.name = name;
  c.inputs.push_back(TensorSpec{{1}, flag_dtype, 0, 0});  // found_inf starts at 0
  c.outputs.push_back(TensorSpec{{1}, flag_dtype});
  c.output_starts_as_input.push_back({0, 0});
  for (size_t i = 0; i < sizes.size(); ++i) {
    c.inputs.push_back(TensorSpec{{sizes[i]}, dtypes[i].first, -100, 100});
    c.outputs.push_back(TensorSpec{{sizes[i]}, in_place ? dtypes[i].first : dtypes[i].second});
    if (in_place) c.output_starts_as_input.push_back({int(i) + 1, int(i) + 1});
  }
  for (size_t k = 0; k < c.outputs.size(); ++k) c.max_nmse.push_back(1e-300);  // exact: one fp32 multiply, one rounding
  c.run = [scale, in_place](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    std::vector<Tensor> ins(in.begin() + 1, in.end()), outs(out.begin() + 1, out.end());
    ops::multi_tensor_scale(ctx, outs, out[0], in_place ? outs : ins, scale);
  };
  return c;
}

// Tensors packed back to back in one buffer at odd offsets (as in a contiguous grad buffer): most views are
// not 16-byte aligned, which takes the kernels' scalar paths.
const std::vector<int64_t> kPacked = {1, 7, 129, 1000, 4096, 3};

std::vector<Tensor> packed_views(const Tensor& flat) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t n : kPacked) {
    out.push_back(flat.slice(at, at + n));
    at += n;
  }
  return out;
}

std::vector<OpCase> packed_cases() {
  int64_t total = 0;
  for (int64_t n : kPacked) total += n;
  std::vector<OpCase> cases;
  OpCase a;
  a.name = "adamw_packed_views";
  a.inputs = {TensorSpec{{total}, DType::F32, -1, 1}, TensorSpec{{total}, DType::F32, -0.1, 0.1},
              TensorSpec{{total}, DType::F32, 0, 0.01}, TensorSpec{{total}, DType::BF16, -1, 1}};
  a.outputs = {TensorSpec{{total}, DType::F32}, TensorSpec{{total}, DType::F32}, TensorSpec{{total}, DType::F32},
               TensorSpec{{total}, DType::BF16}};
  a.output_starts_as_input = {{0, 0}, {1, 1}, {2, 2}};
  a.max_nmse = {1e-12, 1e-12, 1e-12, 0};
  a.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    std::vector<Tensor> p = packed_views(out[0]), m = packed_views(out[1]), v = packed_views(out[2]),
                        g = packed_views(in[3]), model = packed_views(out[3]);
    std::vector<AdamParamGroupTensors> groups;
    for (size_t i = 0; i < p.size(); ++i) groups.push_back({p[i], m[i], v[i], g[i], model[i], std::nullopt});
    AdamWConfig cfg;
    cfg.weight_decay = 0.05f;
    cfg.step = 3;
    ops::adamw_step(ctx, groups, cfg);
  };
  cases.push_back(a);
  OpCase n;
  n.name = "l2_norm_packed_views";
  n.inputs = {TensorSpec{{total}, DType::BF16, -2, 2}};
  n.outputs = {TensorSpec{{1}, DType::F32}, TensorSpec{{int64_t(kPacked.size())}, DType::F32}};
  n.max_nmse = {1e-12, 1e-12};
  n.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    ops::multi_tensor_l2_norm(ctx, out[0], out[1], packed_views(in[0]));
  };
  cases.push_back(n);
  OpCase s;
  s.name = "scale_packed_views";
  s.inputs = {TensorSpec{{1}, DType::F32, 0, 0}, TensorSpec{{total}, DType::F16, -100, 100}};
  s.outputs = {TensorSpec{{1}, DType::F32}, TensorSpec{{total + 1}, DType::F32}};
  s.output_starts_as_input = {{0, 0}};
  s.max_nmse = {1e-300, 1e-300};
  s.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    // Outputs shifted by one element against the inputs: different alignments on each side.
    ops::multi_tensor_scale(ctx, packed_views(out[1].slice(1, out[1].dim(0))), out[0], packed_views(in[1]), 0.125f);
    ops::multi_tensor_scale(ctx, {out[1].slice(0, 1)}, out[0], {in[1].slice(0, 1)}, 2.f);
  };
  cases.push_back(s);
  return cases;
}

// Counting zeros: random inputs (almost no zeros) with planted zero rows of every dtype, and -0.
OpCase count_zeros_case() {
  OpCase c;
  c.name = "count_zeros_mixed";
  const std::vector<std::pair<Shape, DType>> specs = {
      {{1000, 7}, DType::F32}, {{33, 5}, DType::BF16}, {{4097, 3}, DType::F16}, {{1, 1}, DType::F32}};
  for (const auto& [shape, dtype] : specs) c.inputs.push_back({shape, dtype});
  c.outputs = {{Shape{1}, DType::I64}};
  c.max_nmse = {0.0};
  c.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    std::vector<Tensor> copies;
    for (const Tensor& x : in) {
      Tensor y = ctx.empty(x.shape(), x.dtype());
      ops::multi_tensor_scale(ctx, {y}, Tensor(), {x}, 1.0f);
      const int64_t rows = (y.dim(0) + 2) / 3;  // a third of the rows: +0, and -0 where x < 0
      ops::multi_tensor_scale(ctx, {y.slice(0, rows)}, Tensor(), {x.slice(0, rows)}, 0.0f);
      copies.push_back(y);
    }
    ops::multi_tensor_count_zeros(ctx, out[0], copies);
  };
  return c;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases = adam_cases();
  cases.push_back(count_zeros_case());
  for (OpCase& c : packed_cases()) cases.push_back(std::move(c));
  cases.push_back(norm_case("l2_norm_mixed", {{1, DType::F32},
                                              {7, DType::BF16},
                                              {129, DType::F16},
                                              {100003, DType::F32},
                                              {4097, DType::BF16},
                                              {65536, DType::BF16}}));
  std::vector<std::pair<int64_t, DType>> many;
  for (int i = 0; i < 300; ++i) many.push_back({(i * 53) % 500 + 1, i % 2 ? DType::F32 : DType::BF16});
  cases.push_back(norm_case("l2_norm_300_tensors", many));
  const std::vector<std::pair<DType, DType>> pairs = {{DType::F32, DType::BF16},
                                                      {DType::BF16, DType::F32},
                                                      {DType::F16, DType::F16},
                                                      {DType::F32, DType::F32},
                                                      {DType::BF16, DType::F16}};
  const std::vector<int64_t> sizes = {100003, 129, 7, 1, 4096};
  cases.push_back(scale_case("scale_f32flag", pairs, sizes, 1.f / 1024, false, DType::F32));
  cases.push_back(scale_case("scale_i32flag", pairs, sizes, 3.5f, false, DType::I32));
  cases.push_back(scale_case("scale_inplace", pairs, sizes, 0.3f, true, DType::F32));
  return cases;
}

MEGATRON_OP_CASES(Optimizer, all_cases);

// ---- the CPU AdamW against the formula, written here as torch.optim.AdamW states it ----

TEST(OptimizerReference, AdamWMatchesFormula) {
  Context& ctx = testing::cpu_context();
  const int64_t n = 9;
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor p = ctx.empty({n}, dtype), m = ctx.empty({n}, dtype), v = ctx.empty({n}, dtype), g = ctx.empty({n}, dtype);
    Tensor model = ctx.empty({n}, DType::BF16);
    testing::fill_random(p, 1);
    testing::fill_random(m, 2, -0.1, 0.1);
    testing::fill_random(v, 3, 0, 0.01);
    std::vector<double> P = testing::to_doubles(ctx, p), M = testing::to_doubles(ctx, m), V = testing::to_doubles(ctx, v);
    AdamWConfig cfg;
    cfg.lr = 0.01f;
    cfg.beta1 = 0.8f;
    cfg.beta2 = 0.9f;
    cfg.eps = 1e-3f;
    cfg.weight_decay = 0.2f;
    cfg.grad_scale = 0.5f;
    const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay;
    for (int64_t step = 1; step <= 3; ++step) {
      testing::fill_random(g, 10 + uint64_t(step), -2, 2);
      std::vector<double> G = testing::to_doubles(ctx, g);
      cfg.step = step;
      ops::adamw_step(ctx, {AdamParamGroupTensors{p, m, v, g, model, std::nullopt}}, cfg);
      const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
      for (int64_t i = 0; i < n; ++i) {
        double grad = G[size_t(i)] * 0.5;
        P[size_t(i)] *= 1 - lr * wd;
        M[size_t(i)] = b1 * M[size_t(i)] + (1 - b1) * grad;
        V[size_t(i)] = b2 * V[size_t(i)] + (1 - b2) * grad * grad;
        double denom = std::sqrt(V[size_t(i)]) / std::sqrt(bc2) + eps;
        P[size_t(i)] -= (lr / bc1) * M[size_t(i)] / denom;
      }
      std::vector<double> got = testing::to_doubles(ctx, p);
      const double tol = dtype == DType::F64 ? 1e-13 : 1e-6;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(got[size_t(i)], P[size_t(i)], tol) << dtype_name(dtype) << " step " << step << " element " << i;
        // The model param is the stored master, rounded to bf16.
        EXPECT_EQ(model.data<bf16_t>()[i].bits, bf16_from_float(float(got[size_t(i)])).bits);
      }
      if (dtype == DType::F32) {  // keep the formula on the stored (rounded) state
        P = got;
        M = testing::to_doubles(ctx, m);
        V = testing::to_doubles(ctx, v);
      }
    }
  }
}

// Per-entry weight decay override: an entry with weight_decay 0 and one with the config's differ only by decay.
TEST(OptimizerReference, WeightDecayOverride) {
  Context& ctx = testing::cpu_context();
  auto make = [&](uint64_t seed) {
    Tensor t = ctx.empty({5}, DType::F32);
    testing::fill_random(t, seed, 0, 1);
    return t;
  };
  Tensor p0 = make(1), p1 = make(1), m0 = make(2), m1 = make(2), v0 = make(3), v1 = make(3), g = make(4);
  AdamWConfig cfg;
  cfg.weight_decay = 0.5f;
  cfg.lr = 0.1f;
  ops::adamw_step(ctx, {AdamParamGroupTensors{p0, m0, v0, g, Tensor(), 0.0f}, AdamParamGroupTensors{p1, m1, v1, g, Tensor(), std::nullopt}}, cfg);
  Tensor start = make(1);
  for (int i = 0; i < 5; ++i) {
    double p = start.data<float>()[i];
    // Same Adam step, so p1 - p0 is exactly the decay term -lr * wd * p (up to fp32 rounding).
    EXPECT_NEAR(p1.data<float>()[i] - p0.data<float>()[i], -0.1 * 0.5 * p, 1e-6);
  }
}

TEST(OptimizerReference, L2NormMatchesDoubleSum) {
  Context& ctx = testing::cpu_context();
  std::vector<Tensor> ts;
  double total = 0;
  std::vector<double> each;
  for (auto [n, d] : std::vector<std::pair<int64_t, DType>>{{1, DType::F32}, {1000, DType::BF16}, {77, DType::F16}, {0, DType::F32}}) {
    Tensor t = ctx.empty({n}, d);
    testing::fill_random(t, uint64_t(n) + 5, -3, 3);
    double s = 0;
    for (double x : testing::to_doubles(ctx, t)) s += x * x;
    total += s;
    each.push_back(std::sqrt(s));
    ts.push_back(t);
  }
  Tensor out = ctx.empty({1}, DType::F32), per = ctx.empty({4}, DType::F32);
  ops::multi_tensor_l2_norm(ctx, out, per, ts);
  EXPECT_NEAR(out.data<float>()[0], std::sqrt(total), 1e-6 * std::sqrt(total));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(per.data<float>()[i], each[size_t(i)], 1e-6 * each[size_t(i)] + 1e-30);
  EXPECT_EQ(per.data<float>()[3], 0.f);
}

TEST(OptimizerReference, CountZerosCountsEveryZero) {
  Context& ctx = testing::cpu_context();
  std::vector<Tensor> ts;
  int64_t zeros = 0;
  for (auto [n, d] : std::vector<std::pair<int64_t, DType>>{{1, DType::F32}, {100000, DType::BF16}, {77, DType::F16},
                                                           {0, DType::F32}, {5000, DType::F64}}) {
    Tensor t = ctx.empty({n}, d);
    testing::fill_random(t, uint64_t(n) + 11, -1, 1);
    const size_t bytes = dtype_size(d);
    for (int64_t i = 0; i < n; i += 3) {  // every third element, alternating +0 and -0 (the sign bit alone)
      char* element = static_cast<char*>(t.data_ptr()) + size_t(i) * bytes;
      std::memset(element, 0, bytes);
      if (i % 2) element[bytes - 1] = char(0x80);  // little-endian: the sign bit is in the last byte
    }
    for (double x : testing::to_doubles(ctx, t)) zeros += x == 0.0;
    ts.push_back(t);
  }
  Tensor out = ctx.empty({1}, DType::I64);
  ops::multi_tensor_count_zeros(ctx, out, ts);
  EXPECT_EQ(out.data<int64_t>()[0], zeros);
  EXPECT_GE(zeros, 100000 / 3);
}

// found_inf with planted inf / NaN / fp16 overflow, on any context.
void check_found_inf(Context& ctx) {
  Context& cpu = testing::cpu_context();
  auto device = [&](const Tensor& t) { return ctx.is_cuda() ? to_device(ctx, t, ctx.device(), cpu.allocator()) : t; };
  auto flag_after = [&](std::vector<Tensor> ins_cpu, DType out_dtype, float scale) {
    std::vector<Tensor> ins, outs;
    for (const Tensor& t : ins_cpu) {
      ins.push_back(device(t));
      outs.push_back(ctx.empty(t.shape(), out_dtype));
    }
    Tensor flag = cpu.empty({1}, DType::F32);
    flag.data<float>()[0] = 0.f;
    Tensor dflag = device(flag);
    ops::multi_tensor_scale(ctx, outs, dflag, ins, scale);
    return testing::to_doubles(ctx, dflag)[0];
  };
  auto clean = [&](int64_t n, uint64_t seed) {
    Tensor t = cpu.empty({n}, DType::F32);
    testing::fill_random(t, seed, -1, 1);
    return t;
  };
  EXPECT_EQ(flag_after({clean(100003, 1), clean(7, 2)}, DType::F32, 0.5f), 0.0);
  for (int64_t where : {int64_t(0), int64_t(50000), int64_t(100002)}) {
    Tensor bad = clean(100003, 3);
    bad.data<float>()[where] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(flag_after({clean(7, 2), bad}, DType::BF16, 0.5f), 1.0) << "inf at " << where;
    bad.data<float>()[where] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(flag_after({bad, clean(7, 2)}, DType::F32, 2.f), 1.0) << "nan at " << where;
  }
  Tensor big = clean(129, 4);
  big.data<float>()[100] = 60000.f;
  EXPECT_EQ(flag_after({big}, DType::F16, 2.f), 1.0) << "fp16 overflow";
  EXPECT_EQ(flag_after({big}, DType::F32, 2.f), 0.0);
}

TEST(OptimizerReference, FoundInfIsSetByPlantedValues) { check_found_inf(testing::cpu_context()); }

// ---- bad inputs ----

TEST(OptimizerBadInput, AdamW) {
  Context& ctx = testing::cpu_context();
  Tensor p = ctx.empty({5}, DType::F32), m = ctx.empty({5}, DType::F32), v = ctx.empty({5}, DType::F32);
  Tensor g = ctx.empty({5}, DType::BF16);
  AdamWConfig cfg;
  expect_error([&] { ops::adamw_step(ctx, {AdamParamGroupTensors{p, m, ctx.empty({4}, DType::F32), g, Tensor(), std::nullopt}}, cfg); },
               {"adamw_step", "tensors[0].exp_avg_sq", "5 elements"});
  expect_error([&] { ops::adamw_step(ctx, {AdamParamGroupTensors{p, m, v, g, Tensor(), std::nullopt}, AdamParamGroupTensors{p, ctx.empty({5}, DType::BF16), v, g, Tensor(), std::nullopt}}, cfg); },
               {"adamw_step", "tensors[1].exp_avg", "bf16"});
  expect_error([&] { ops::adamw_step(ctx, {AdamParamGroupTensors{ctx.empty({5}, DType::BF16), m, v, g, Tensor(), std::nullopt}}, cfg); },
               {"adamw_step", "tensors[0].param", "bf16"});
  expect_error([&] { ops::adamw_step(ctx, {AdamParamGroupTensors{p, m, v, g, ctx.empty({6}, DType::BF16), std::nullopt}}, cfg); },
               {"adamw_step", "tensors[0].model_param"});
  AdamWConfig zero_step;
  zero_step.step = 0;
  expect_error([&] { ops::adamw_step(ctx, {}, zero_step); }, {"adamw_step", "step"});
}

TEST(OptimizerBadInput, NormAndScale) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty({5}, DType::F32), b = ctx.empty({3}, DType::BF16);
  expect_error([&] { ops::multi_tensor_l2_norm(ctx, ctx.empty({2}, DType::F32), Tensor(), {a, b}); },
               {"multi_tensor_l2_norm", "out", "[1]"});
  expect_error([&] { ops::multi_tensor_l2_norm(ctx, ctx.empty({1}, DType::F32), ctx.empty({3}, DType::F32), {a, b}); },
               {"multi_tensor_l2_norm", "per_tensor_out", "[2]"});
  expect_error([&] { ops::multi_tensor_l2_norm(ctx, ctx.empty({1}, DType::F32), Tensor(), {a, ctx.empty({3}, DType::I32)}); },
               {"multi_tensor_l2_norm", "tensors[1]", "i32"});
  expect_error([&] { ops::multi_tensor_scale(ctx, {a}, Tensor(), {a, b}, 1.f); }, {"multi_tensor_scale", "1 outputs for 2 inputs"});
  expect_error([&] { ops::multi_tensor_scale(ctx, {a, ctx.empty({4}, DType::F32)}, Tensor(), {a, b}, 1.f); },
               {"multi_tensor_scale", "outs[1]", "3 elements"});
  expect_error([&] { ops::multi_tensor_scale(ctx, {a}, ctx.empty({1}, DType::BF16), {a}, 1.f); },
               {"multi_tensor_scale", "found_inf", "bf16"});
}

// ---- GPU-only ----

TEST(OptimizerGpu, FoundInfIsSetByPlantedValues) {
  MEGATRON_REQUIRE_GPU();
  check_found_inf(testing::cuda_context());
}

// The model param written by the CUDA step is exactly bf16(the CUDA master), element for element.
TEST(OptimizerGpu, ModelParamIsRoundedMaster) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  std::vector<AdamParamGroupTensors> groups;
  for (int64_t n : {1, 7, 129, 100003}) {
    auto t = [&](uint64_t seed, double lo, double hi, DType d) {
      Tensor h = cpu.empty({n}, d);
      testing::fill_random(h, seed + uint64_t(n), lo, hi);
      return to_device(gpu, h, gpu.device(), cpu.allocator());
    };
    groups.push_back(AdamParamGroupTensors{t(1, -1, 1, DType::F32), t(2, -0.1, 0.1, DType::F32), t(3, 0, 0.01, DType::F32),
                                           t(4, -1, 1, DType::BF16), gpu.empty({n}, DType::BF16), std::nullopt});
  }
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  ops::adamw_step(gpu, groups, cfg);
  for (const auto& g : groups) {
    std::vector<double> master = testing::to_doubles(gpu, g.param), model = testing::to_doubles(gpu, g.model_param);
    for (size_t i = 0; i < master.size(); ++i)
      ASSERT_EQ(model[i], double(to_float(bf16_from_float(float(master[i]))))) << "element " << i << " of " << master.size();
  }
}

TEST(OptimizerGpu, L2NormIsBitwiseDeterministic) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  std::vector<Tensor> ts;
  for (int i = 0; i < 90; ++i) {
    Tensor h = cpu.empty({int64_t(i) * 997 + 1}, i % 2 ? DType::BF16 : DType::F32);
    testing::fill_normal(h, uint64_t(i));
    ts.push_back(to_device(gpu, h, gpu.device(), cpu.allocator()));
  }
  Tensor a = gpu.empty({1}, DType::F32), b = gpu.empty({1}, DType::F32);
  Tensor pa = gpu.empty({90}, DType::F32), pb = gpu.empty({90}, DType::F32);
  ops::multi_tensor_l2_norm(gpu, a, pa, ts);
  ops::multi_tensor_l2_norm(gpu, b, pb, ts);
  std::vector<double> va = testing::to_doubles(gpu, a), vb = testing::to_doubles(gpu, b);
  std::vector<double> wa = testing::to_doubles(gpu, pa), wb = testing::to_doubles(gpu, pb);
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(double)), 0);
}

}  // namespace
}  // namespace megatron
