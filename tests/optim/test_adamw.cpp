// The AdamW class on the CPU against a scalar double implementation of decoupled-weight-decay Adam over
// several steps, with weight decay on for some parameters and off for others, a changing lr, a grad scale;
// fp64 parameters (their own masters, tight tolerance), fp32 parameters (aliased masters) and bf16
// parameters (fp32 masters, the bf16 weights equal to the rounded masters). CPU offload, and on a GPU the offload's
// overlapped transfers against the plain ones.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/optim/adamw.h"

namespace megatron::optim {
namespace {

using testing::cpu_context;
using testing::fill_normal;
using testing::fill_random;
using testing::to_doubles;

// Plain AdamW on doubles. Hyperparameters go through float, as AdamW hands them to the op in fp32.
struct ScalarAdamW {
  std::vector<double> p, m, v;
  bool no_wd = false;
  void step(const std::vector<double>& grad, int64_t t, double lr, double wd, double grad_scale, const AdamWOptions& o) {
    const double b1 = double(float(o.beta1)), b2 = double(float(o.beta2)), eps = double(float(o.eps));
    const double lr32 = double(float(lr)), wd32 = no_wd ? 0.0 : double(float(wd)), gs = double(float(grad_scale));
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * gs;
      p[i] -= lr32 * wd32 * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, double(t)));
      const double vhat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= lr32 * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

struct Setup {
  std::vector<Shape> shapes;
  std::vector<bool> no_wd;
};

// Runs `steps` steps of the class on ctx (the CPU unless given) and of the scalar reference; returns the largest
// relative error of the masters (|got - ref| / max(|ref|, 1e-3)).
double run_and_compare(DType param_dtype, const Setup& setup, int steps, Context& ctx = cpu_context()) {
  Context& cpu = cpu_context();
  const AdamWOptions options{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  std::vector<AdamWParam> params;
  std::vector<ScalarAdamW> ref;
  for (size_t i = 0; i < setup.shapes.size(); ++i) {
    AdamWParam p;
    Tensor initial = cpu.empty(setup.shapes[i], param_dtype);
    fill_random(initial, 100 + i, -1, 1);
    p.param = testing::copy_on(ctx, initial);
    p.main_grad = ctx.empty(setup.shapes[i], param_dtype == DType::F64 ? DType::F64 : DType::F32);
    p.no_weight_decay = setup.no_wd[i];
    ScalarAdamW r;
    r.p = to_doubles(ctx, p.param);  // the (rounded) initial weights
    r.m.assign(r.p.size(), 0.0);
    r.v.assign(r.p.size(), 0.0);
    r.no_wd = setup.no_wd[i];
    ref.push_back(std::move(r));
    params.push_back(std::move(p));
  }
  std::vector<AdamWParam> views = params;
  AdamW adam(ctx, std::move(views), options);
  for (int t = 1; t <= steps; ++t) {
    const double lr = 1e-2 * (1.0 + 0.25 * t);  // changes every step
    const double wd = 0.1;
    const float grad_scale = t == 3 ? 0.5f : 1.0f;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor grad = cpu.empty(params[i].main_grad.shape(), params[i].main_grad.dtype());
      fill_normal(grad, 1000 * t + i, 0.1 * t);
      copy_tensor(ctx, params[i].main_grad, grad);
      ref[i].step(to_doubles(cpu, grad), t, lr, wd, grad_scale, options);
    }
    adam.step(ctx, lr, wd, grad_scale);
  }
  EXPECT_EQ(adam.step_count(), steps);
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<double> got = to_doubles(ctx, adam.master(i));
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::abs(got[k] - ref[i].p[k]) / std::max(std::abs(ref[i].p[k]), 1e-3));
    if (param_dtype == DType::F32 || param_dtype == DType::F64) {
      EXPECT_EQ(adam.master(i).data_ptr(), params[i].param.data_ptr()) << "fp32/fp64 params are their own masters";
    } else {
      // The model weights are the masters rounded to the parameter dtype.
      Tensor rounded = ctx.empty(adam.master(i).shape(), param_dtype);
      ops::cast(ctx, rounded, adam.master(i));
      EXPECT_EQ(to_doubles(ctx, rounded), to_doubles(ctx, params[i].param.view({params[i].param.numel()})));
    }
  }
  return worst;
}

const Setup kSetup = {{Shape{7, 13}, Shape{13}, Shape{5, 3, 4}, Shape{1}, Shape{}, Shape{300}},
                      {false, true, false, true, false, true}};

TEST(AdamW, Fp64ParamsMatchTheScalarReference) { EXPECT_LT(run_and_compare(DType::F64, kSetup, 6), 1e-12); }

TEST(AdamW, Fp32ParamsMatchTheScalarReference) { EXPECT_LT(run_and_compare(DType::F32, kSetup, 6), 1e-5); }

TEST(AdamW, Bf16ParamsKeepFp32Masters) { EXPECT_LT(run_and_compare(DType::BF16, kSetup, 6), 1e-5); }

// On a GPU the device entries' masters and moments are views of one buffer each, every entry's start aligned for
// the update's vector accesses. Against the scalar reference (kSetup: 1 to 300 elements), and bit for bit against
// the same op stepping each parameter with state of its own (separate allocations) for entries of odd sizes up to
// 70,001 elements: a view that overlapped its neighbour, or lost the vector path's alignment to a wrong result,
// changes bits.
TEST(AdamWGpu, SharedStateBuffersUpdateLikeSeparateState) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  Context& cpu = cpu_context();
  EXPECT_LT(run_and_compare(DType::F32, kSetup, 6, gpu), 1e-5);
  EXPECT_LT(run_and_compare(DType::BF16, kSetup, 6, gpu), 1e-5);
  const std::vector<int64_t> sizes = {4099, 1, 195, 70001, 64, 3};
  const AdamWOptions options{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  std::vector<AdamWParam> params;
  std::vector<ops::AdamParamGroupTensors> separate;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor initial = cpu.empty({sizes[i]}, DType::BF16);
    fill_random(initial, 300 + i, -1, 1);
    AdamWParam p{.param = testing::copy_on(gpu, initial), .main_grad = gpu.empty({sizes[i]}, DType::F32)};
    p.no_weight_decay = i % 2 == 1;
    ops::AdamParamGroupTensors t{.param = gpu.empty({sizes[i]}, DType::F32), .exp_avg = gpu.empty({sizes[i]}, DType::F32),
                                 .exp_avg_sq = gpu.empty({sizes[i]}, DType::F32), .grad = p.main_grad,
                                 .model_param = testing::copy_on(gpu, initial)};
    ops::cast(gpu, t.param, t.model_param);
    ops::fill(gpu, t.exp_avg, 0.0);
    ops::fill(gpu, t.exp_avg_sq, 0.0);
    params.push_back(p);
    separate.push_back(t);
  }
  AdamW adam(gpu, params, options);
  for (int step = 1; step <= 4; ++step) {
    const double lr = 1e-2 * step, wd = 0.1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor grad = cpu.empty({sizes[i]}, DType::F32);
      fill_normal(grad, 900 * step + i, 0.1);
      copy_tensor(gpu, params[i].main_grad, grad);
      separate[i].weight_decay = params[i].no_weight_decay ? 0.0f : float(wd);
    }
    adam.step(gpu, lr, wd, 1.0f);
    const ops::AdamWConfig config{.lr = float(lr), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                  .weight_decay = float(wd), .step = step, .grad_scale = 1.0f};
    for (const ops::AdamParamGroupTensors& t : separate) ops::adamw_step(gpu, {t}, config);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(str_cat("entry ", i, " of ", sizes[i], " elements"));
    EXPECT_EQ(to_doubles(gpu, adam.master(i)), to_doubles(gpu, separate[i].param));
    EXPECT_EQ(to_doubles(gpu, adam.exp_avg(i)), to_doubles(gpu, separate[i].exp_avg));
    EXPECT_EQ(to_doubles(gpu, adam.exp_avg_sq(i)), to_doubles(gpu, separate[i].exp_avg_sq));
    EXPECT_EQ(to_doubles(gpu, params[i].param), to_doubles(gpu, separate[i].model_param));
  }
}

// CPU offload: whole entries, in order, while the offloaded elements are fewer than the fraction of all (kSetup's
// 91 + 13 + 60 + 1 + 1 + 300 = 466 elements: 0.3 -> the first three entries, 164 >= 139.8); their state moves
// out of state_bytes() into host_state_bytes(), and the updates are the same bits (the same CPU kernel here).
TEST(AdamW, OffloadedEntriesUpdateLikeTheOthers) {
  Context& ctx = cpu_context();
  for (DType dt : {DType::BF16, DType::F32}) {
    std::vector<AdamWParam> a, b;
    for (size_t i = 0; i < kSetup.shapes.size(); ++i) {
      for (std::vector<AdamWParam>* list : {&a, &b}) {
        AdamWParam p;
        p.param = ctx.empty(kSetup.shapes[i], dt);
        fill_random(p.param, 300 + i, -1, 1);
        p.main_grad = ctx.empty(kSetup.shapes[i], DType::F32);
        p.no_weight_decay = kSetup.no_wd[i];
        list->push_back(p);
      }
    }
    AdamW plain(ctx, a, {});
    AdamW offloaded(ctx, b, {.offload_fraction = 0.3});
    EXPECT_EQ(offloaded.offloaded_entries(), 3u);
    EXPECT_EQ(plain.offloaded_entries(), 0u);
    EXPECT_EQ(plain.host_state_bytes(), 0u);
    EXPECT_LT(offloaded.state_bytes(), plain.state_bytes());
    EXPECT_GE(offloaded.host_state_bytes(), 164u * 4 * 3);  // master and both moments, fp32
    for (int t = 1; t <= 4; ++t) {
      for (size_t i = 0; i < a.size(); ++i) {
        fill_normal(a[i].main_grad, 50 * t + i, 0.1);
        fill_normal(b[i].main_grad, 50 * t + i, 0.1);
      }
      plain.step(ctx, 1e-2, 0.1, t == 2 ? 0.5f : 1.0f);
      offloaded.step(ctx, 1e-2, 0.1, t == 2 ? 0.5f : 1.0f);
    }
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(to_doubles(ctx, a[i].param), to_doubles(ctx, b[i].param)) << dtype_name(dt) << " entry " << i;
      EXPECT_EQ(to_doubles(ctx, plain.master(i)), to_doubles(ctx, offloaded.master(i)));
      EXPECT_EQ(to_doubles(ctx, plain.exp_avg_sq(i)), to_doubles(ctx, offloaded.exp_avg_sq(i)));
    }
    // Reloading the model's weights refreshes the host masters too.
    ops::fill(ctx, b[0].param, 0.25);
    offloaded.reload_model_params(ctx);
    for (double v : to_doubles(ctx, offloaded.master(0))) EXPECT_EQ(v, 0.25);
  }
}

// --decoupled-lr: the embedding_or_output entries step with the decoupled rate (in the update and in the
// weight decay), the others with lr, whether they update on the device or offloaded to the host; without a
// decoupled rate every entry takes lr.
TEST(AdamW, DecoupledLrDrivesTheEmbeddingOrOutputEntries) {
  Context& ctx = cpu_context();
  const AdamWOptions options{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  const std::vector<bool> flagged = {true, false, false, true, false, false};  // entry 0 offloaded at 0.3, 3 not
  for (double fraction : {0.0, 0.3})
    for (bool with_decoupled : {true, false}) {
      SCOPED_TRACE(str_cat("offload fraction ", fraction, with_decoupled ? ", decoupled lr" : ", no decoupled lr"));
      std::vector<AdamWParam> params;
      std::vector<ScalarAdamW> ref;
      for (size_t i = 0; i < kSetup.shapes.size(); ++i) {
        AdamWParam p;
        p.param = ctx.empty(kSetup.shapes[i], DType::F64);
        fill_random(p.param, 500 + i, -1, 1);
        p.main_grad = ctx.empty(kSetup.shapes[i], DType::F64);
        p.no_weight_decay = kSetup.no_wd[i];
        p.embedding_or_output = flagged[i];
        ScalarAdamW r;
        r.p = to_doubles(ctx, p.param);
        r.m.assign(r.p.size(), 0.0);
        r.v.assign(r.p.size(), 0.0);
        r.no_wd = kSetup.no_wd[i];
        ref.push_back(std::move(r));
        params.push_back(std::move(p));
      }
      AdamWOptions o = options;
      o.offload_fraction = fraction;
      AdamW adam(ctx, params, o);
      for (int t = 1; t <= 3; ++t) {
        const double lr = 1e-2 / t, decoupled = 3e-2 / t;
        for (size_t i = 0; i < params.size(); ++i) {
          fill_normal(params[i].main_grad, 70 * t + i, 0.1);
          const double entry_lr = with_decoupled && flagged[i] ? decoupled : lr;
          ref[i].step(to_doubles(ctx, params[i].main_grad), t, entry_lr, 0.1, 1.0, options);
        }
        adam.step(ctx, lr, 0.1, 1.0f, with_decoupled ? std::optional<double>(decoupled) : std::nullopt);
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const std::vector<double> got = to_doubles(ctx, params[i].param);
        for (size_t k = 0; k < got.size(); ++k) ASSERT_NEAR(got[k], ref[i].p[k], 1e-12) << "entry " << i;
      }
    }
}

TEST(AdamW, WeightDecayOnlyWhereEnabled) {
  // Zero gradients: Adam's update is 0 / (0 + eps) = 0, so only the decoupled decay moves the weights.
  Context& ctx = cpu_context();
  std::vector<AdamWParam> params(2);
  for (int i = 0; i < 2; ++i) {
    params[i].param = ctx.empty(Shape{4, 4}, DType::F64);
    fill_random(params[i].param, 7 + i, 0.5, 1.5);
    params[i].main_grad = ctx.empty(Shape{4, 4}, DType::F64);
    ops::fill(ctx, params[i].main_grad, 0.0);
  }
  params[1].no_weight_decay = true;
  const std::vector<double> w0 = to_doubles(ctx, params[0].param), b0 = to_doubles(ctx, params[1].param);
  AdamW adam(ctx, params);
  adam.step(ctx, 0.5, 0.1);
  adam.step(ctx, 0.5, 0.1);
  const std::vector<double> w = to_doubles(ctx, params[0].param), b = to_doubles(ctx, params[1].param);
  const double factor = (1 - double(0.5f) * double(0.1f)) * (1 - double(0.5f) * double(0.1f));
  for (size_t k = 0; k < w.size(); ++k) {
    EXPECT_NEAR(w[k], w0[k] * factor, 1e-15);
    EXPECT_EQ(b[k], b0[k]);
  }
}

TEST(AdamW, MomentsStartAtZeroAndReloadCopiesModelParams) {
  Context& ctx = cpu_context();
  AdamWParam p;
  p.param = ctx.empty(Shape{9}, DType::BF16);
  fill_random(p.param, 3);
  p.main_grad = ctx.empty(Shape{9}, DType::F32);
  AdamW adam(ctx, {p});
  EXPECT_EQ(adam.master(0).dtype(), DType::F32);
  EXPECT_EQ(to_doubles(ctx, adam.master(0)), to_doubles(ctx, p.param));
  EXPECT_EQ(to_doubles(ctx, adam.exp_avg(0)), std::vector<double>(9, 0.0));
  EXPECT_EQ(to_doubles(ctx, adam.exp_avg_sq(0)), std::vector<double>(9, 0.0));
  fill_random(p.param, 4);  // e.g. weights loaded from a checkpoint
  adam.reload_model_params(ctx);
  EXPECT_EQ(to_doubles(ctx, adam.master(0)), to_doubles(ctx, p.param));
}

TEST(AdamW, RejectsMismatchedGradients) {
  Context& ctx = cpu_context();
  AdamWParam p;
  p.param = ctx.empty(Shape{4}, DType::F32);
  p.main_grad = ctx.empty(Shape{5}, DType::F32);
  testing::expect_error([&] { AdamW(ctx, {p}); }, {"params[0]", "main_grad"});
}

// On a GPU, --overlap-cpu-optimizer-d2h-h2d (copies on side streams, the host updating entry by entry, gradient
// copies handed over early by prefetch_gradients) leaves the same bits as the plain offload, whose copies are
// synchronous on ctx's stream. Per round: the gradients are written on ctx's stream, entries 0-2 are announced final
// (entry 1 excepted: its gradient changes afterwards, as finalize_model_grads changes a norm's), entry 1's gradient
// is then doubled, and the next round's gradients overwrite them all right after the step. Round 3 is a skipped
// update (prefetched, then discarded): round 4 must copy every gradient again. A copy taken before its gradient is
// final, one not waited for, or a stale one left from round 3 changes the weights.
TEST(AdamWGpu, OverlappedOffloadTransfersEqualThePlainOffload) {
  MEGATRON_REQUIRE_GPU();
  Context& ctx = testing::cuda_context();
  Context& cpu = cpu_context();
  const std::vector<int64_t> sizes = {33 * 4096, 517, 70001, 3, 1 << 18};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  for (double fraction : {1.0, 0.3}) {  // every entry; entries 0-2 (the rest update on the GPU)
    SCOPED_TRACE(str_cat("offload fraction ", fraction));
    std::vector<Tensor> grads;
    std::vector<std::vector<AdamWParam>> lists(2);
    for (auto& list : lists) {
      grads.push_back(ctx.empty({total}, DType::F32));
      int64_t at = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        Tensor host = cpu.empty({sizes[i]}, DType::BF16);
        fill_random(host, 700 + i, -1, 1);
        AdamWParam p;
        p.param = ctx.empty({sizes[i]}, DType::BF16);
        copy_tensor(ctx, p.param, host);
        p.main_grad = grads.back().slice(at, at + sizes[i]);
        p.no_weight_decay = i == 3;
        p.grad_changes_after_reduction = i == 1;
        list.push_back(p);
        at += sizes[i];
      }
    }
    AdamW plain(ctx, lists[0], {.offload_fraction = fraction});
    AdamW overlapped(ctx, lists[1], {.offload_fraction = fraction, .overlap_offload_transfers = true});
    ASSERT_EQ(plain.offloaded_entries(), overlapped.offloaded_entries());
    ASSERT_GE(overlapped.offloaded_entries(), 3u);
    Tensor host_grads = cpu.empty({total}, DType::F32);
    for (int round = 1; round <= 5; ++round) {
      fill_normal(host_grads, 90 + round, 0.1);
      for (const Tensor& g : grads) copy_tensor(ctx, g, host_grads);
      overlapped.prefetch_gradients(ctx, grads[1].slice(0, sizes[0] + sizes[1] + sizes[2]), ctx.stream());
      for (const auto& list : lists) ops::scale(ctx, list[1].main_grad, list[1].main_grad, 2.0);
      overlapped.join_gradient_prefetches(ctx);
      if (round == 3) {
        overlapped.discard_gradient_prefetches();
        continue;
      }
      plain.step(ctx, 1e-2, 0.1, 0.7f);
      overlapped.step(ctx, 1e-2, 0.1, 0.7f);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(to_doubles(ctx, lists[0][i].param), to_doubles(ctx, lists[1][i].param)) << "entry " << i;
      EXPECT_EQ(to_doubles(ctx, plain.master(i)), to_doubles(ctx, overlapped.master(i))) << "entry " << i;
    }
  }
}

}  // namespace
}  // namespace megatron::optim
