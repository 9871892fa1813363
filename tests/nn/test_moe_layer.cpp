// MoELayer on one rank (fp64, CPU) against a direct implementation of Megatron's MoE in plain loops: the
// router (softmax with top-k then softmax over the k, pre-softmax, sigmoid with top-k normalisation), every
// selected expert's MLP (SwiGLU or GELU) weighted by its probability, the switch load-balancing loss and the
// z-loss. The forward output and the logged loss values must match the reference; every gradient (input,
// router, both expert weights) must match central finite differences of the reference's scalar
// L = <out, dout> + aux_loss + z_loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "harness.h"
#include "megatron/nn/moe_layer.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {
namespace {

using testing::cpu_context;
using testing::to_doubles;

struct Case {
  const char* name;
  RouterScore score;
  bool pre_softmax;
  int topk;
  bool swiglu;
  double aux_coeff, z_coeff;
  double seq_coeff = 0;  // seq_aux_loss over the two sequences of 4 tokens the 8 rows hold
  bool sinkhorn = false;
};

std::vector<int> top(const std::vector<double>& key, int k);

// Megatron's sinkhorn(exp(logits)) [T, E] in double, and the top-k of the balanced costs per token.
std::vector<std::vector<int>> sinkhorn_choice(const std::vector<double>& logits, int64_t T, int64_t E, int k) {
  std::vector<double> cost(logits.size()), d0(static_cast<size_t>(T), 1.0), d1(static_cast<size_t>(E), 1.0);
  for (size_t i = 0; i < cost.size(); ++i) cost[i] = std::exp(logits[i]);
  for (double error = 1e9; error > 1e-4;) {
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[size_t(e)] * cost[size_t(t * E + e)];
      d0[size_t(t)] = 1.0 / double(T) / (s + 1e-8);
    }
    const std::vector<double> old = d1;
    error = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += d0[size_t(t)] * cost[size_t(t * E + e)];
      d1[size_t(e)] = 1.0 / double(E) / (s + 1e-8);
      error += std::fabs(old[size_t(e)] - d1[size_t(e)]) / double(E);
    }
  }
  std::vector<std::vector<int>> out;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> row(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) row[size_t(e)] = cost[size_t(t * E + e)] * d0[size_t(t)] * d1[size_t(e)];
    out.push_back(top(row, k));
  }
  return out;
}

struct Weights {
  std::vector<double> router, fc1, fc2;  // [E, h], [E, N, h], [E, h, F]
};

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu(double x) { return x / (1 + std::exp(-x)); }

// The k best of `key` (descending; ties: the lower index first).
std::vector<int> top(const std::vector<double>& key, int k) {
  std::vector<int> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[size_t(a)] > key[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

struct Reference {
  const Case& c;
  int64_t T, h, E, F;
  int64_t S = T;  // tokens per sequence

  // L = <out, dout> + aux + z, and (optionally) out and the logged aux / z values.
  double loss(const Weights& w, const std::vector<double>& x, const std::vector<double>& dout,
              std::vector<double>* out = nullptr, double* aux_value = nullptr, double* z_value = nullptr,
              double* seq_value = nullptr) const {
    const int64_t N = c.swiglu ? 2 * F : F;
    std::vector<double> y(size_t(T * h), 0.0), A(static_cast<size_t>(T * E), 0.0);
    std::vector<double> counts(size_t(E), 0.0), colsum(size_t(E), 0.0);
    const int64_t B = T / S;
    std::vector<double> seq_counts(static_cast<size_t>(B * E), 0.0), seq_colsum(static_cast<size_t>(B * E), 0.0);
    double z = 0;
    std::vector<std::vector<int>> sink;
    if (c.sinkhorn) {
      std::vector<double> all(static_cast<size_t>(T * E), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e)
          for (int64_t j = 0; j < h; ++j) all[size_t(t * E + e)] += x[size_t(t * h + j)] * w.router[size_t(e * h + j)];
      sink = sinkhorn_choice(all, T, E, c.topk);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> logit(static_cast<size_t>(E), 0.0);
      for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t j = 0; j < h; ++j) s += x[size_t(t * h + j)] * w.router[size_t(e * h + j)];
        logit[size_t(e)] = s;
      }
      const double mx = *std::max_element(logit.begin(), logit.end());
      double se = 0;
      for (double l : logit) se += std::exp(l - mx);
      const double lse = mx + std::log(se);
      z += lse * lse / double(T);
      std::vector<double> score(static_cast<size_t>(E), 0.0), probs;
      std::vector<int> sel;
      if (c.score == RouterScore::Softmax) {
        for (int64_t e = 0; e < E; ++e) score[size_t(e)] = std::exp(logit[size_t(e)] - lse);
        if (c.pre_softmax) {
          sel = top(score, c.topk);
          for (int e : sel) probs.push_back(score[size_t(e)]);
        } else {
          sel = top(logit, c.topk);
          double m2 = logit[size_t(sel[0])], s2 = 0;
          for (int e : sel) s2 += std::exp(logit[size_t(e)] - m2);
          for (int e : sel) probs.push_back(std::exp(logit[size_t(e)] - m2) / s2);
        }
        for (int64_t e = 0; e < E; ++e) A[size_t(t * E + e)] = score[size_t(e)];
      } else {
        double sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += score[size_t(e)] = 1 / (1 + std::exp(-logit[size_t(e)]));
        sel = top(score, c.topk);
        double ssel = 0;
        for (int e : sel) ssel += score[size_t(e)];
        for (int e : sel) probs.push_back(c.topk > 1 ? score[size_t(e)] / (ssel + 1e-20) : score[size_t(e)]);
        for (int64_t e = 0; e < E; ++e) A[size_t(t * E + e)] = score[size_t(e)] / (sum + 1e-20);
      }
      std::vector<double> arow(A.begin() + t * E, A.begin() + (t + 1) * E);
      if (c.sinkhorn) {  // gates: the activation at the balanced choice, not renormalised
        sel = sink[size_t(t)];
        probs.clear();
        for (int e : sel) probs.push_back(score[size_t(e)]);
      }
      for (int e : top(arow, c.topk)) counts[size_t(e)] += 1, seq_counts[size_t(t / S * E + e)] += 1;
      for (int64_t e = 0; e < E; ++e) colsum[size_t(e)] += arow[size_t(e)], seq_colsum[size_t(t / S * E + e)] += arow[size_t(e)];
      for (size_t s = 0; s < sel.size(); ++s) {
        const int64_t e = sel[s];
        std::vector<double> a(static_cast<size_t>(N), 0.0), act(static_cast<size_t>(F), 0.0);
        for (int64_t n = 0; n < N; ++n) {
          double v = 0;
          for (int64_t j = 0; j < h; ++j) v += w.fc1[size_t((e * N + n) * h + j)] * x[size_t(t * h + j)];
          a[size_t(n)] = v;
        }
        for (int64_t f = 0; f < F; ++f) act[size_t(f)] = c.swiglu ? silu(a[size_t(f)]) * a[size_t(F + f)] : gelu(a[size_t(f)]);
        for (int64_t j = 0; j < h; ++j) {
          double v = 0;
          for (int64_t f = 0; f < F; ++f) v += w.fc2[size_t((e * h + j) * F + f)] * act[size_t(f)];
          y[size_t(t * h + j)] += probs[s] * v;
        }
      }
    }
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) aux += colsum[size_t(e)] * counts[size_t(e)];
    aux *= double(E) / (double(c.topk) * double(T) * double(T));
    double seq = 0;
    for (int64_t i = 0; i < B * E; ++i) seq += seq_colsum[size_t(i)] * seq_counts[size_t(i)];
    seq *= double(E) / (double(c.topk) * double(S) * double(S) * double(B));
    if (seq_value) *seq_value = seq;
    if (out) *out = y;
    if (aux_value) *aux_value = aux;
    if (z_value) *z_value = z;
    double L = 0;
    for (size_t i = 0; i < y.size(); ++i) L += y[i] * dout[i];
    return L + c.aux_coeff * aux + c.z_coeff * z + c.seq_coeff * seq;
  }
};

TransformerConfig moe_config(const Case& c, int64_t h, int E, int64_t F) {
  TransformerConfig t;
  t.num_layers = 1;
  t.hidden_size = h;
  t.num_attention_heads = 2;
  t.num_query_groups = 2;
  t.kv_channels = h / 2;
  t.ffn_hidden_size = F;
  t.swiglu = c.swiglu;
  t.add_bias_linear = false;
  t.params_dtype = DType::F64;
  t.init_method_std = 0.5;  // large enough that the experts and the router matter in the output
  t.moe.num_experts = E;
  t.moe.ffn_hidden_size = F;
  t.moe.topk = c.topk;
  t.moe.score = c.score;
  t.moe.pre_softmax = c.pre_softmax;
  if (c.aux_coeff > 0) t.moe.aux_losses.push_back({AuxLossType::AuxLoss, c.aux_coeff});
  t.moe.z_loss_coeff = c.z_coeff;
  t.moe.sinkhorn = c.sinkhorn;
  if (c.seq_coeff > 0) t.moe.aux_losses.push_back({AuxLossType::SeqAuxLoss, c.seq_coeff});
  return t;
}

Tensor random_tensor(Shape shape, const std::string& seed) {
  Tensor t = cpu_context().empty(shape, DType::F64);
  testing::fill_random(t, testing::seed_from(seed), -1.0, 1.0);
  return t;
}

class MoELayerTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoELayerTest, MatchesMegatronsFormulasAndFiniteDifferences) {
  const Case& c = GetParam();
  Context& ctx = cpu_context();
  const int64_t T = c.seq_coeff > 0 ? 8 : 7, S = c.seq_coeff > 0 ? 4 : T, h = 6, F = 5;
  const int E = 4;
  const TransformerConfig config = moe_config(c, h, E, F);
  MoELayer layer(ctx, "decoder.layers.0.mlp", config, {}, {});
  layer.init(ctx, config);
  Tensor x = random_tensor({T, h}, std::string(c.name) + "x");
  const Tensor dout = random_tensor({T, h}, std::string(c.name) + "dy");
  if (c.sinkhorn) {
    // Every token prefers expert 0 by far (positive inputs, a large positive router row 0), so the plain top-k
    // and the balanced choice differ.
    testing::fill_random(x, testing::seed_from(std::string(c.name) + "x+"), 0.5, 1.5);
    std::vector<double> w0 = to_doubles(ctx, layer.router.weight.value);
    for (int64_t j = 0; j < h; ++j) w0[size_t(j)] += 1.0;
    copy_tensor(ctx, layer.router.weight.value, Tensor::from_blob(w0.data(), {E, h}, DType::F64, Device::cpu()));
  }
  Tensor out = ctx.empty({T, h}, DType::F64), dx = ctx.empty({T, h}, DType::F64);
  MoESaved saved = layer.forward(ctx, out, x, /*training=*/true, {.seq = S, .first_row = 0, .total_rows = T});
  for (Parameter* p : std::vector<Parameter*>{&layer.router.weight, &layer.experts.linear_fc1, &layer.experts.linear_fc2})
    ops::fill(ctx, p->main_grad, 0.0);
  layer.backward(ctx, std::move(saved), dx, dout, /*loss_grad_scale=*/1.0);

  Weights w{to_doubles(ctx, layer.router.weight.value), to_doubles(ctx, layer.experts.linear_fc1.value),
            to_doubles(ctx, layer.experts.linear_fc2.value)};
  std::vector<double> xs = to_doubles(ctx, x);
  const std::vector<double> dys = to_doubles(ctx, dout);
  const Reference ref{c, T, h, E, F, S};
  std::vector<double> want;
  double aux = 0, z = 0, seq = 0;
  ref.loss(w, xs, dys, &want, &aux, &z, &seq);
  const std::vector<double> got = to_doubles(ctx, out);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << "out " << i;
  const std::vector<double> metrics = to_doubles(ctx, layer.router.metrics());
  if (c.aux_coeff > 0) {
    EXPECT_NEAR(metrics[0], aux, 1e-12 * (1 + aux));
  }
  if (c.z_coeff > 0) {
    EXPECT_NEAR(metrics[2], z, 1e-12 * (1 + z));
  }
  if (c.seq_coeff > 0) {
    EXPECT_NEAR(metrics[3], seq, 1e-12 * (1 + seq));
  }

  const double eps = 1e-6;
  auto check = [&](const char* what, std::vector<double>& values, const std::vector<double>& grad) {
    ASSERT_EQ(values.size(), grad.size()) << what;
    for (size_t i = 0; i < values.size(); i += std::max<size_t>(1, values.size() / 17)) {
      const double keep = values[i];
      values[i] = keep + eps;
      const double up = ref.loss(w, xs, dys);
      values[i] = keep - eps;
      const double down = ref.loss(w, xs, dys);
      values[i] = keep;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-6 * (1 + std::fabs(fd))) << what << " element " << i;
    }
  };
  check("dx", xs, to_doubles(ctx, dx));
  check("router", w.router, to_doubles(ctx, layer.router.weight.main_grad));
  check("fc1", w.fc1, to_doubles(ctx, layer.experts.linear_fc1.main_grad));
  check("fc2", w.fc2, to_doubles(ctx, layer.experts.linear_fc2.main_grad));
}

// --moe-shared-expert-gate (Qwen2-MoE): out = routed + sigmoid(x . gate_weight) * shared_experts(x), per token.
// The forward against that sum made from its parts; every gradient (input, gate, router, shared and routed
// experts) against central finite differences of L = <out, dout> through the layer's own forward, with and
// without selective recomputation of the shared experts.
TEST(MoELayerSharedGate, GatesTheSharedExpertsPerTokenAndItsGradientsMatchFiniteDifferences) {
  Context& ctx = cpu_context();
  const int64_t T = 7, h = 6, F = 5;
  const Case c{"gate", RouterScore::Softmax, false, 2, true, 0.0, 0.0};
  for (bool recompute : {false, true}) {
    TransformerConfig config = moe_config(c, h, 4, F);
    config.moe.shared_expert_ffn = 8;
    config.moe.shared_expert_gate = true;
    if (recompute) config.recompute = RecomputeConfig{.granularity = RecomputeGranularity::Selective,
                                                      .shared_experts = true};
    MoELayer layer(ctx, "decoder.layers.0.mlp", config, {}, {});
    layer.init(ctx, config);
    ASSERT_TRUE(layer.shared_gate.defined());
    EXPECT_EQ(layer.shared_gate.name, "decoder.layers.0.mlp.shared_experts.gate_weight");
    Tensor x = random_tensor({T, h}, "gate x");
    const Tensor dout = random_tensor({T, h}, "gate dy");
    auto forward = [&](const Tensor& at) {
      Tensor out = ctx.empty({T, h}, DType::F64);
      (void)layer.forward(ctx, out, at, /*training=*/false);
      return to_doubles(ctx, out);
    };
    // The parts: the shared experts alone and the gate's logits; the routed part is the output without them.
    const std::vector<double> gated = forward(x);
    Tensor shared = ctx.empty({T, h}, DType::F64);
    (void)layer.shared_experts->forward(ctx, shared, x);
    const std::vector<double> sh = to_doubles(ctx, shared), w = to_doubles(ctx, layer.shared_gate.value);
    const std::vector<double> xs = to_doubles(ctx, x);
    std::unique_ptr<MLP> keep = std::move(layer.shared_experts);
    const std::vector<double> routed = forward(x);  // no shared experts: the routed part only
    layer.shared_experts = std::move(keep);
    for (int64_t t = 0; t < T; ++t) {
      double z = 0;
      for (int64_t j = 0; j < h; ++j) z += xs[size_t(t * h + j)] * w[size_t(j)];
      const double g = 1 / (1 + std::exp(-z));
      for (int64_t j = 0; j < h; ++j) {
        const size_t i = size_t(t * h + j);
        ASSERT_NEAR(gated[i], routed[i] + g * sh[i], 1e-12) << "token " << t << " channel " << j;
      }
    }
    // Gradients.
    ParameterList params;
    layer.collect_parameters(params);
    for (Parameter* p : params) ops::fill(ctx, p->main_grad, 0.0);
    Tensor out = ctx.empty({T, h}, DType::F64), dx = ctx.empty({T, h}, DType::F64);
    MoESaved saved = layer.forward(ctx, out, x, /*training=*/true);
    layer.backward(ctx, std::move(saved), dx, dout, 1.0);
    const std::vector<double> dys = to_doubles(ctx, dout);
    auto loss = [&] {
      const std::vector<double> o = forward(x);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += o[i] * dys[i];
      return l;
    };
    auto check = [&](const std::string& what, const Tensor& value, const std::vector<double>& grad) {
      std::vector<double> v = to_doubles(ctx, value);
      for (size_t i = 0; i < v.size(); i += std::max<size_t>(1, v.size() / 13)) {
        const double keep_v = v[i], eps = 1e-6;
        auto set = [&](double val) {
          v[i] = val;
          copy_tensor(ctx, value, Tensor::from_blob(v.data(), value.shape(), DType::F64, Device::cpu()));
        };
        set(keep_v + eps);
        const double up = loss();
        set(keep_v - eps);
        const double down = loss();
        set(keep_v);
        const double fd = (up - down) / (2 * eps);
        EXPECT_NEAR(grad[i], fd, 1e-6 * (1 + std::fabs(fd))) << what << " element " << i << (recompute ? " (recomputed)" : "");
      }
    };
    check("dx", x, to_doubles(ctx, dx));
    for (Parameter* p : params) check(p->name, p->value, to_doubles(ctx, p->main_grad));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routers, MoELayerTest,
    ::testing::Values(Case{"softmax_top2_swiglu_aux_z", RouterScore::Softmax, false, 2, true, 0.3, 0.2},
                      Case{"softmax_pre_top1_gelu", RouterScore::Softmax, true, 1, false, 0.0, 0.0},
                      Case{"softmax_pre_top3_swiglu_aux", RouterScore::Softmax, true, 3, true, 0.5, 0.0},
                      Case{"sigmoid_top2_gelu_aux_z", RouterScore::Sigmoid, false, 2, false, 0.4, 0.1},
                      Case{"sigmoid_top1_swiglu", RouterScore::Sigmoid, false, 1, true, 0.0, 0.0},
                      Case{"softmax_top2_seq_aux_and_aux", RouterScore::Softmax, false, 2, true, 0.2, 0.0, 0.7},
                      Case{"sigmoid_top2_seq_aux", RouterScore::Sigmoid, false, 2, false, 0.0, 0.05, 0.6},
                      // Sinkhorn: top-1 gates sigmoid, top-2 the softmax over all experts (set as the score
                      // function the reference applies), chosen by the balanced costs.
                      Case{"sinkhorn_top1", RouterScore::Sigmoid, false, 1, true, 0.0, 0.0, 0.0, true},
                      Case{"sinkhorn_top2_z", RouterScore::Softmax, true, 2, true, 0.0, 0.1, 0.0, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace megatron::nn

namespace megatron::nn {
namespace {

TEST(MoERouter, ExpertBiasSteersTheSelectionAndMovesOncePerStepAsMegatron) {
  Context& ctx = testing::cpu_context();
  const Case c{"bias", RouterScore::Sigmoid, false, 2, true, 0.0, 0.0};
  TransformerConfig config = moe_config(c, 6, 4, 5);
  config.params_dtype = DType::F32;
  config.moe.expert_bias = true;
  config.moe.bias_update_rate = 0.25;
  TopKRouter router(ctx, "decoder.layers.0.mlp.router", config, {}, {});
  router.init(ctx, config);
  const int64_t T = 9;
  Tensor x = ctx.empty({T, 6}, DType::F32);
  testing::fill_random(x, testing::seed_from("bias x"), -1.0, 1.0);
  Tensor probs = ctx.empty({T, 2}, DType::F32), idx = ctx.empty({T, 2}, DType::I32);
  // Two training forwards count their selections; the update moves every expert by +-rate (or 0 at the mean).
  std::vector<double> counts(4, 0.0);
  for (int pass = 0; pass < 2; ++pass) {
    RouterSaved s = router.forward(ctx, probs, idx, x, /*training=*/true);
    for (double e : to_doubles(ctx, idx)) counts[size_t(e)] += 1;
  }
  router.update_expert_bias(ctx);
  const double mean = (counts[0] + counts[1] + counts[2] + counts[3]) / 4;
  const std::vector<double> bias = to_doubles(ctx, router.expert_bias.value);
  for (int e = 0; e < 4; ++e) {
    const double sign = mean > counts[size_t(e)] ? 1.0 : mean < counts[size_t(e)] ? -1.0 : 0.0;
    EXPECT_FLOAT_EQ(float(bias[size_t(e)]), float(0.25 * sign)) << "expert " << e;
  }
  // A large bias on expert 3 puts it in every token's top 2; the gates stay the unbiased normalised scores.
  const std::vector<float> steer = {0.f, 0.f, 0.f, 50.f};
  copy_tensor(ctx, router.expert_bias.value, Tensor::from_blob(const_cast<float*>(steer.data()), {4}, DType::F32, Device::cpu()));
  RouterSaved s = router.forward(ctx, probs, idx, x, /*training=*/false);
  const std::vector<double> ids = to_doubles(ctx, idx), p = to_doubles(ctx, probs), scores = to_doubles(ctx, s.scores);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(ids[size_t(2 * t)], 3.0) << "token " << t;
    const double s3 = scores[size_t(4 * t + 3)], so = scores[size_t(4 * t) + size_t(ids[size_t(2 * t + 1)])];
    EXPECT_NEAR(p[size_t(2 * t)], s3 / (s3 + so), 1e-6) << "token " << t;
  }
}

}  // namespace
}  // namespace megatron::nn
