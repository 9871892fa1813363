// cross_entropy family: CUDA vs CPU on every dtype and odd vocabularies, finite-difference gradients of the
// loss (alone and through the masked mean), a naive-formula check of the CPU reference, bad inputs.
#include <cmath>
#include <cstring>
#include <limits>

#include "harness.h"
#include "megatron/ops/cross_entropy/cross_entropy.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using testing::GradCase;
using testing::OpCase;
using testing::TensorSpec;

struct Shape2 {
  int64_t tokens, vocab;
};

// Vocabularies: tiny, odd, GPT-2 (50257, padded 50304), Llama 2 (32000) and Llama 3 (128256) sizes.
const Shape2 kShapes[] = {{1, 7}, {5, 1}, {7, 129}, {129, 1000}, {33, 4097}, {16, 50257}, {4, 50304}, {3, 32000}, {6, 128256}};
const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

std::string tag(const Shape2& s, DType d, DType ti) {
  return str_cat(s.tokens, "x", s.vocab, "_", dtype_name(d), "_", dtype_name(ti));
}

std::vector<OpCase> forward_cases() {
  std::vector<OpCase> cases;
  for (const Shape2& s : kShapes)
    for (DType d : kDtypes)
      for (DType ti : {DType::I32, DType::I64}) {
        if (ti == DType::I64 && d != DType::BF16) continue;  // index width matters only once
        OpCase c;
        c.name = "forward_" + tag(s, d, ti);
        c.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -8, 8}, TensorSpec{{s.tokens}, ti, 0, double(s.vocab)}};
        c.outputs = {TensorSpec{{s.tokens}, DType::F32}, TensorSpec{{s.tokens}, DType::F32}};
        c.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
          ops::cross_entropy_forward(ctx, out[0], out[1], in[0], in[1]);
        };
        cases.push_back(c);
      }
  return cases;
}

// Backward after the forward (so lse is the row's real log-sum-exp); in_place writes dlogits over logits.
std::vector<OpCase> backward_cases() {
  std::vector<OpCase> cases;
  for (const Shape2& s : kShapes)
    for (DType d : kDtypes)
      for (bool in_place : {false, true}) {
        if (in_place && d == DType::F32) continue;
        OpCase c;
        c.name = str_cat("backward_", tag(s, d, DType::I32), in_place ? "_inplace" : "");
        c.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -8, 8}, TensorSpec{{s.tokens}, DType::I32, 0, double(s.vocab)},
                    TensorSpec{{s.tokens}, DType::F32, -1, 1}};
        c.outputs = {TensorSpec{{s.tokens, s.vocab}, d}};
        if (in_place) c.output_starts_as_input = {{0, 0}};
        c.run = [in_place](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
          Tensor losses = ctx.empty(in[1].shape(), DType::F32), lse = ctx.empty(in[1].shape(), DType::F32);
          const Tensor& logits = in_place ? out[0] : in[0];
          ops::cross_entropy_forward(ctx, losses, lse, logits, in[1]);
          ops::cross_entropy_backward(ctx, out[0], in[2], logits, in[1], lse);
        };
        cases.push_back(c);
      }
  return cases;
}

// The fused forward + backward (both outputs: losses and lse, and dlogits, in place or not).
std::vector<OpCase> fused_cases() {
  std::vector<OpCase> cases;
  for (const Shape2& s : kShapes)
    for (DType d : kDtypes)
      for (bool in_place : {false, true}) {
        if (in_place && d == DType::F32) continue;
        OpCase c;
        c.name = str_cat("fused_", tag(s, d, DType::I64), in_place ? "_inplace" : "");
        c.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -8, 8}, TensorSpec{{s.tokens}, DType::I64, 0, double(s.vocab)},
                    TensorSpec{{s.tokens}, DType::F32, -1, 1}};
        c.outputs = {TensorSpec{{s.tokens}, DType::F32}, TensorSpec{{s.tokens}, DType::F32},
                     TensorSpec{{s.tokens, s.vocab}, d}};
        if (in_place) c.output_starts_as_input = {{2, 0}};
        c.run = [in_place](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
          const Tensor& logits = in_place ? out[2] : in[0];
          ops::cross_entropy_forward_backward(ctx, out[0], out[1], out[2], in[2], logits, in[1]);
        };
        cases.push_back(c);
      }
  return cases;
}

std::vector<OpCase> masked_mean_cases() {
  std::vector<OpCase> cases;
  for (int64_t t : {1, 7, 129, 16384})
    for (bool with_mask : {true, false}) {
      OpCase c;
      c.name = str_cat("masked_mean_", t, with_mask ? "_mask" : "_nomask");
      c.inputs = {TensorSpec{{t}, DType::F32, 0, 12}, TensorSpec{{t}, DType::F32, 0, 1}};
      c.outputs = {TensorSpec{{1}, DType::F32}, TensorSpec{{t}, DType::F32}};
      c.run = [with_mask, t](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        Tensor mask = with_mask ? in[1] : Tensor();
        ops::masked_mean_loss(ctx, out[0], in[0], mask);
        ops::masked_mean_loss_grad(ctx, out[1], mask, 0.37 * double(t));
      };
      cases.push_back(c);
    }
  return cases;
}

// Vocabulary-parallel pieces on one shard [start, start + V) of a global vocabulary: the statistics, their
// combination over 3 stacked shards' statistics, and the shard's backward (targets anywhere in the global range).
std::vector<OpCase> vocab_parallel_cases() {
  std::vector<OpCase> cases;
  struct Shard {
    int64_t tokens, global, start, vocab;
  };
  for (Shard s : {Shard{7, 40, 0, 20}, Shard{7, 40, 20, 20}, Shard{129, 50304, 25152, 25152}, Shard{33, 128256, 64128, 64128},
                  Shard{5, 13, 6, 3}})
    for (DType d : {DType::F32, DType::BF16}) {
      const std::string name = str_cat(s.tokens, "x", s.vocab, "_of", s.global, "_at", s.start, "_", dtype_name(d));
      OpCase st;
      st.name = "vp_stats_" + name;
      st.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -8, 8}, TensorSpec{{s.tokens}, DType::I64, 0, double(s.global)}};
      st.outputs = {TensorSpec{{3, s.tokens}, DType::F32}};
      st.run = [s](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        ops::vocab_parallel_cross_entropy_stats(ctx, out[0], in[0], in[1], s.start, s.global);
      };
      cases.push_back(st);
      OpCase b;
      b.name = "vp_backward_" + name;
      b.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -8, 8}, TensorSpec{{s.tokens}, DType::I64, 0, double(s.global)},
                  TensorSpec{{s.tokens}, DType::F32, -1, 1}, TensorSpec{{s.tokens}, DType::F32, 8, 12}};
      b.outputs = {TensorSpec{{s.tokens, s.vocab}, d}};
      b.run = [s](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        ops::vocab_parallel_cross_entropy_backward(ctx, out[0], in[2], in[0], in[1], in[3], s.start, s.global);
      };
      cases.push_back(b);
    }
  OpCase c;
  c.name = "vp_combine_3x1000";
  // Maxima in [-5, 5], sums in [1, 50], target logits in [-3, 3]: any values combine.
  c.inputs = {TensorSpec{{3, 1, 1000}, DType::F32, -5, 5}, TensorSpec{{3, 1, 1000}, DType::F32, 1, 50},
              TensorSpec{{3, 1, 1000}, DType::F32, -3, 3}};
  c.outputs = {TensorSpec{{1000}, DType::F32}, TensorSpec{{1000}, DType::F32}};
  c.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    Tensor stats = ctx.empty({3, 3, 1000}, DType::F32);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t k = 0; k < 3; ++k) copy_tensor(ctx, stats.select(r).select(k), in[size_t(k)].select(r).select(0));
    ops::vocab_parallel_cross_entropy_combine(ctx, out[0], out[1], stats);
  };
  cases.push_back(c);
  return cases;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases = forward_cases();
  for (auto* more : {&backward_cases, &fused_cases, &masked_mean_cases, &vocab_parallel_cases})
    for (OpCase& c : more()) cases.push_back(std::move(c));
  return cases;
}

MEGATRON_OP_CASES(CrossEntropy, all_cases);

// ---- finite differences (fp64, CPU) ----

// The harness hands every input over as F64; targets come back to integers here.
Tensor to_index(Context& ctx, const Tensor& f64) {
  Tensor ids = ctx.empty(f64.shape(), DType::I64);
  for (int64_t i = 0; i < f64.numel(); ++i) ids.data<int64_t>()[i] = int64_t(std::floor(f64.data<double>()[i]));
  return ids;
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (Shape2 s : {Shape2{1, 1}, Shape2{3, 7}, Shape2{5, 129}, Shape2{2, 1031}}) {
    GradCase c;
    c.name = str_cat("loss_", s.tokens, "x", s.vocab);
    c.inputs = {TensorSpec{{s.tokens, s.vocab}, DType::F64, -4, 4}, TensorSpec{{s.tokens}, DType::F64, 0, double(s.vocab)}};
    c.differentiable = {0};
    c.forward = [](Context& ctx, const std::vector<Tensor>& in) {
      Tensor losses = ctx.empty({in[0].dim(0)}, DType::F64), lse = ctx.empty({in[0].dim(0)}, DType::F64);
      ops::cross_entropy_forward(ctx, losses, lse, in[0], to_index(ctx, in[1]));
      return std::vector<Tensor>{losses};
    };
    c.backward = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
      Tensor losses = ctx.empty({in[0].dim(0)}, DType::F64), lse = ctx.empty({in[0].dim(0)}, DType::F64);
      Tensor targets = to_index(ctx, in[1]);
      ops::cross_entropy_forward(ctx, losses, lse, in[0], targets);
      Tensor dlogits = ctx.empty(in[0].shape(), DType::F64);
      ops::cross_entropy_backward(ctx, dlogits, g[0], in[0], targets, lse);
      return std::vector<Tensor>{dlogits};
    };
    cases.push_back(c);
  }
  // Through the masked mean: d(mean)/d(losses) from masked_mean_loss_grad with denominator sum(mask) / g.
  GradCase m;
  m.name = "masked_mean_9x33";
  m.inputs = {TensorSpec{{9, 33}, DType::F64, -4, 4}, TensorSpec{{9}, DType::F64, 0, 33}, TensorSpec{{9}, DType::F64, 0, 1}};
  m.differentiable = {0};
  auto mask_f32 = [](Context& ctx, const Tensor& f64) {
    Tensor mask = ctx.empty(f64.shape(), DType::F32);
    // 0/1 mask with the last token always counted, so the denominator is never 0.
    for (int64_t i = 0; i < f64.numel(); ++i)
      mask.data<float>()[i] = (f64.data<double>()[i] < 0.6 || i + 1 == f64.numel()) ? 1.f : 0.f;
    return mask;
  };
  m.forward = [mask_f32](Context& ctx, const std::vector<Tensor>& in) {
    Tensor losses = ctx.empty({9}, DType::F64), lse = ctx.empty({9}, DType::F64), out = ctx.empty({1}, DType::F64);
    ops::cross_entropy_forward(ctx, losses, lse, in[0], to_index(ctx, in[1]));
    ops::masked_mean_loss(ctx, out, losses, mask_f32(ctx, in[2]));
    return std::vector<Tensor>{out};
  };
  m.backward = [mask_f32](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& g) {
    Tensor losses = ctx.empty({9}, DType::F64), lse = ctx.empty({9}, DType::F64), dlosses = ctx.empty({9}, DType::F64);
    Tensor targets = to_index(ctx, in[1]), mask = mask_f32(ctx, in[2]);
    ops::cross_entropy_forward(ctx, losses, lse, in[0], targets);
    double sum = 0;
    for (int i = 0; i < 9; ++i) sum += mask.data<float>()[i];
    ops::masked_mean_loss_grad(ctx, dlosses, mask, sum / g[0].data<double>()[0]);
    Tensor dlogits = ctx.empty(in[0].shape(), DType::F64);
    ops::cross_entropy_backward(ctx, dlogits, dlosses, in[0], targets, lse);
    return std::vector<Tensor>{dlogits};
  };
  cases.push_back(m);
  return cases;
}

MEGATRON_GRAD_CASES(CrossEntropy, grad_cases);

// The CPU reference against the definition written out here: -log(exp(x_t) / sum_v exp(x_v)).
TEST(CrossEntropyReference, MatchesNaiveFormula) {
  Context& ctx = testing::cpu_context();
  const int64_t tokens = 6, vocab = 11;
  Tensor logits = ctx.empty({tokens, vocab}, DType::F64), targets = ctx.empty({tokens}, DType::I32);
  testing::fill_random(logits, 7, -3, 3);
  for (int64_t t = 0; t < tokens; ++t) targets.data<int32_t>()[t] = int32_t((t * 5 + 3) % vocab);
  Tensor losses = ctx.empty({tokens}, DType::F64), lse = ctx.empty({tokens}, DType::F64);
  ops::cross_entropy_forward(ctx, losses, lse, logits, targets);
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(logits.data<double>()[t * vocab + v]);
    double p = std::exp(logits.data<double>()[t * vocab + targets.data<int32_t>()[t]]) / sum;
    EXPECT_NEAR(losses.data<double>()[t], -std::log(p), 1e-12) << "row " << t;
    EXPECT_NEAR(lse.data<double>()[t], std::log(sum), 1e-12) << "row " << t;
  }
  // Masked mean: written out directly.
  Tensor mask = ctx.empty({tokens}, DType::F32), out = ctx.empty({1}, DType::F64);
  double num = 0, den = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    mask.data<float>()[t] = float(t % 3) * 0.5f;
    num += losses.data<double>()[t] * mask.data<float>()[t];
    den += mask.data<float>()[t];
  }
  ops::masked_mean_loss(ctx, out, losses, mask);
  EXPECT_NEAR(out.data<double>()[0], num / den, 1e-12);
}

// Shards of the vocabulary: stats per shard, combined, give cross_entropy_forward's losses and lse; the shards'
// backward gradients are the columns of the whole backward. Targets fall in every shard.
TEST(CrossEntropyReference, VocabShardsComposeToTheWholeLoss) {
  Context& ctx = testing::cpu_context();
  const int64_t tokens = 9, vocab = 23;
  const int64_t bounds[] = {0, 8, 16, 23};
  Tensor logits = ctx.empty({tokens, vocab}, DType::F64), targets = ctx.empty({tokens}, DType::I64);
  Tensor dlosses = ctx.empty({tokens}, DType::F64);
  testing::fill_random(logits, 11, -6, 6);
  testing::fill_random(dlosses, 12);
  for (int64_t t = 0; t < tokens; ++t) targets.data<int64_t>()[t] = (t * 5 + 2) % vocab;
  Tensor losses = ctx.empty({tokens}, DType::F64), lse = ctx.empty({tokens}, DType::F64);
  ops::cross_entropy_forward(ctx, losses, lse, logits, targets);
  Tensor dwhole = ctx.empty({tokens, vocab}, DType::F64);
  ops::cross_entropy_backward(ctx, dwhole, dlosses, logits, targets, lse);

  Tensor stats = ctx.empty({3, 3, tokens}, DType::F64);
  std::vector<Tensor> shards;
  for (int k = 0; k < 3; ++k) {
    const int64_t start = bounds[k], width = bounds[k + 1] - start;
    Tensor shard = ctx.empty({tokens, width}, DType::F64);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t v = 0; v < width; ++v)
        shard.data<double>()[t * width + v] = logits.data<double>()[t * vocab + start + v];
    ops::vocab_parallel_cross_entropy_stats(ctx, stats.select(k), shard, targets, start, vocab);
    shards.push_back(shard);
  }
  Tensor vp_losses = ctx.empty({tokens}, DType::F64), vp_lse = ctx.empty({tokens}, DType::F64);
  ops::vocab_parallel_cross_entropy_combine(ctx, vp_losses, vp_lse, stats);
  for (int64_t t = 0; t < tokens; ++t) {
    EXPECT_NEAR(vp_losses.data<double>()[t], losses.data<double>()[t], 1e-12) << "row " << t;
    EXPECT_NEAR(vp_lse.data<double>()[t], lse.data<double>()[t], 1e-12) << "row " << t;
  }
  for (int k = 0; k < 3; ++k) {
    const int64_t start = bounds[k], width = bounds[k + 1] - start;
    Tensor d = ctx.empty({tokens, width}, DType::F64);
    ops::vocab_parallel_cross_entropy_backward(ctx, d, dlosses, shards[size_t(k)], targets, lse, start, vocab);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t v = 0; v < width; ++v)
        EXPECT_NEAR(d.data<double>()[t * width + v], dwhole.data<double>()[t * vocab + start + v], 1e-15)
            << "shard " << k << " row " << t << " column " << v;
  }
  expect_error([&] { ops::vocab_parallel_cross_entropy_stats(ctx, stats.select(0), shards[2], targets, 16, 22); },
               {"vocab_parallel_cross_entropy_stats", "[16, 23)", "[0, 22)"});
  targets.data<int64_t>()[4] = vocab;
  expect_error([&] { ops::vocab_parallel_cross_entropy_stats(ctx, stats.select(0), shards[0], targets, 0, vocab); },
               {"vocab_parallel_cross_entropy_stats", "targets[4]", "23"});
}

// Huge logits must not overflow: the loss of a row is shift-invariant.
TEST(CrossEntropyReference, ShiftInvariant) {
  Context& ctx = testing::cpu_context();
  Tensor a = ctx.empty({2, 9}, DType::F32), b = ctx.empty({2, 9}, DType::F32), targets = ctx.empty({2}, DType::I64);
  testing::fill_random(a, 3, -2, 2);
  for (int i = 0; i < 18; ++i) b.data<float>()[i] = a.data<float>()[i] + 1000.f;
  targets.data<int64_t>()[0] = 0;
  targets.data<int64_t>()[1] = 8;
  Tensor la = ctx.empty({2}, DType::F32), lb = ctx.empty({2}, DType::F32), sa = ctx.empty({2}, DType::F32),
         sb = ctx.empty({2}, DType::F32);
  ops::cross_entropy_forward(ctx, la, sa, a, targets);
  ops::cross_entropy_forward(ctx, lb, sb, b, targets);
  for (int t = 0; t < 2; ++t) {
    EXPECT_TRUE(std::isfinite(lb.data<float>()[t]));
    EXPECT_NEAR(la.data<float>()[t], lb.data<float>()[t], 1e-3);
  }
}

// ---- bad inputs ----
TEST(CrossEntropyBadInput, TargetOutOfRangeNamesRowAndValue) {
  Context& ctx = testing::cpu_context();
  Tensor logits = ctx.empty({3, 5}, DType::F32), targets = ctx.empty({3}, DType::I32);
  testing::fill_random(logits, 1);
  targets.data<int32_t>()[0] = 1;
  targets.data<int32_t>()[1] = 4;
  targets.data<int32_t>()[2] = -100;
  Tensor losses = ctx.empty({3}, DType::F32), lse = ctx.empty({3}, DType::F32);
  expect_error([&] { ops::cross_entropy_forward(ctx, losses, lse, logits, targets); },
               {"cross_entropy_forward", "targets[2]", "-100", "[0, 5)"});
  Tensor dlosses = ctx.empty({3}, DType::F32);
  testing::fill_random(dlosses, 2);
  targets.data<int32_t>()[2] = 5;
  expect_error([&] { ops::cross_entropy_backward(ctx, logits, dlosses, logits, targets, lse); },
               {"cross_entropy_backward", "targets[2]", "5"});
}

TEST(CrossEntropyBadInput, ShapesAndDtypes) {
  Context& ctx = testing::cpu_context();
  Tensor logits = ctx.empty({4, 6}, DType::BF16), targets = ctx.empty({4}, DType::I32);
  Tensor losses = ctx.empty({4}, DType::F32), lse = ctx.empty({4}, DType::F32);
  expect_error([&] { ops::cross_entropy_forward(ctx, losses, lse, logits, ctx.empty({3}, DType::I32)); },
               {"cross_entropy_forward", "targets", "[3]", "[4]"});
  expect_error([&] { ops::cross_entropy_forward(ctx, losses, lse, logits, ctx.empty({4}, DType::F32)); },
               {"cross_entropy_forward", "targets", "f32"});
  expect_error([&] { ops::cross_entropy_forward(ctx, ctx.empty({4}, DType::BF16), lse, logits, targets); },
               {"cross_entropy_forward", "losses", "bf16"});
  expect_error([&] { ops::cross_entropy_forward(ctx, losses, lse, ctx.empty({4, 6, 1}, DType::BF16), targets); },
               {"cross_entropy_forward", "logits", "rank 2"});
  expect_error([&] { ops::cross_entropy_backward(ctx, ctx.empty({4, 6}, DType::F32), losses, logits, targets, lse); },
               {"cross_entropy_backward", "dlogits", "bf16"});
  expect_error([&] { ops::cross_entropy_backward(ctx, ctx.empty({4, 5}, DType::BF16), losses, logits, targets, lse); },
               {"cross_entropy_backward", "dlogits", "[4, 5]", "[4, 6]"});
  // A partial overlap of dlogits and logits (rows shifted by one) is refused.
  Tensor big = ctx.empty({5, 6}, DType::BF16);
  expect_error([&] { ops::cross_entropy_backward(ctx, big.slice(1, 5), losses, big.slice(0, 4), targets, lse); },
               {"cross_entropy_backward", "overlaps"});
  expect_error([&] { ops::masked_mean_loss(ctx, ctx.empty({1}, DType::F32), losses, ctx.empty({5}, DType::F32)); },
               {"masked_mean_loss", "loss_mask", "[5]"});
  expect_error([&] { ops::masked_mean_loss_grad(ctx, losses, Tensor(), 0.0); }, {"masked_mean_loss_grad", "denominator"});
}

// ---- GPU-only ----

// An out-of-range target on the GPU poisons its row (NaN loss, NaN gradient) and leaves the others exact.
TEST(CrossEntropyGpu, OutOfRangeTargetGivesNaNRow) {
  MEGATRON_REQUIRE_GPU();
  Context& cpu = testing::cpu_context();
  Context& gpu = testing::cuda_context();
  Tensor logits = cpu.empty({3, 77}, DType::F32), targets = cpu.empty({3}, DType::I32);
  testing::fill_random(logits, 5, -3, 3);
  targets.data<int32_t>()[0] = 3;
  targets.data<int32_t>()[1] = 77;
  targets.data<int32_t>()[2] = 76;
  Tensor dl = gpu.empty({3}, DType::F32), losses = gpu.empty({3}, DType::F32), lse = gpu.empty({3}, DType::F32);
  Tensor glogits = to_device(gpu, logits, gpu.device(), cpu.allocator());
  Tensor gtargets = to_device(gpu, targets, gpu.device(), cpu.allocator());
  ops::cross_entropy_forward(gpu, losses, lse, glogits, gtargets);
  ops::masked_mean_loss_grad(gpu, dl, Tensor(), 3.0);
  Tensor dlogits = gpu.empty({3, 77}, DType::F32);
  ops::cross_entropy_backward(gpu, dlogits, dl, glogits, gtargets, lse);
  std::vector<double> l = testing::to_doubles(gpu, losses), d = testing::to_doubles(gpu, dlogits);
  EXPECT_TRUE(std::isfinite(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isfinite(l[2]));
  for (int v = 0; v < 77; ++v) {
    EXPECT_TRUE(std::isfinite(d[v]));
    EXPECT_TRUE(std::isnan(d[77 + v]));
    EXPECT_TRUE(std::isfinite(d[154 + v]));
  }
}

// A bigger table for the GPU only (the CPU reference of each case runs once): training-size rows.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> cases;
  for (Shape2 s : {Shape2{512, 50304}, Shape2{129, 128256}, Shape2{1000, 50257}})
    for (DType d : {DType::BF16, DType::F32}) {
      OpCase c;
      c.name = "fwd_bwd_inplace_" + tag(s, d, DType::I64);
      c.inputs = {TensorSpec{{s.tokens, s.vocab}, d, -10, 10}, TensorSpec{{s.tokens}, DType::I64, 0, double(s.vocab)},
                  TensorSpec{{s.tokens}, DType::F32, 0, 1e-3}};
      c.outputs = {TensorSpec{{s.tokens}, DType::F32}, TensorSpec{{s.tokens, s.vocab}, d}};
      c.output_starts_as_input = {{1, 0}};
      c.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        Tensor lse = ctx.empty(in[1].shape(), DType::F32);
        ops::cross_entropy_forward(ctx, out[0], lse, out[1], in[1]);
        ops::cross_entropy_backward(ctx, out[1], in[2], out[1], in[1], lse);
      };
      cases.push_back(c);
      OpCase f = c;
      f.name = "fused_inplace_" + tag(s, d, DType::I64);
      f.outputs = {TensorSpec{{s.tokens}, DType::F32}, TensorSpec{{s.tokens}, DType::F32}, TensorSpec{{s.tokens, s.vocab}, d}};
      f.output_starts_as_input = {{2, 0}};
      f.run = [](Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        ops::cross_entropy_forward_backward(ctx, out[0], out[1], out[2], in[2], out[2], in[1]);
      };
      cases.push_back(f);
    }
  return cases;
}

class CrossEntropyGpuLarge : public ::testing::TestWithParam<OpCase> {};
TEST_P(CrossEntropyGpuLarge, CudaMatchesCpu) {
  MEGATRON_REQUIRE_GPU();
  testing::expect_cuda_matches_cpu(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyGpuLarge, ::testing::ValuesIn(large_cases()),
                         [](const auto& info) { return testing::gtest_name(info.param.name); });

}  // namespace
}  // namespace megatron
