// GPTModel and its modules: gradients of the whole model against finite differences (fp64, CPU) for
// the architecture variants; the loss of an untrained model against ln(V); Megatron's init per parameter
// kind; the fused QKV layout against a plain-loop attention; dropout bookkeeping; and (GptModelGpu, on
// the GPU machine) CUDA bf16 against the CPU fp32 model.
//
// GPU decision: the CUDA model runs in BF16 only. The fused attention (cuDNN) has no fp32 path, so an F32
// model on CUDA is rejected at construction with a clear message (tested below); GPU parity is CUDA BF16
// vs the CPU F32 model started from the same (bf16-rounded) weights, nmse <= 1e-3 for every gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "model_batches.h"
#include "megatron/nn/attention.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/train/model_config.h"

namespace megatron::nn {
namespace {

using testing::cpu_context;
using testing::seed_from;
using testing::to_doubles;

train::ModelArguments tiny_args() {
  train::ModelArguments a;
  a.num_layers = 2;
  a.hidden_size = 16;
  a.num_attention_heads = 4;
  a.seq_length = 8;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 8;  // padded to 40
  a.hidden_dropout = 0.0;
  a.attention_dropout = 0.0;
  return a;
}

// A: GPT-2 style.
train::ModelArguments config_a() { return tiny_args(); }
// B: Llama style with partial rotary, GQA, untied, no bias.
train::ModelArguments config_b() {
  train::ModelArguments a = tiny_args();
  a.position_embedding_type = "rope";
  a.rotary_percent = 0.5;
  a.normalization = "RMSNorm";
  a.swiglu = true;
  a.ffn_hidden_size = 24;
  a.num_query_groups = 2;
  a.group_query_attention = true;
  a.untie_embeddings_and_output_weights = true;
  a.disable_bias_linear = true;
  return a;
}
// C: multi-query attention, no position embedding, kv_channels 6 (n * d != h), biases, tied.
train::ModelArguments config_c() {
  train::ModelArguments a = tiny_args();
  a.position_embedding_type = "none";
  a.num_query_groups = 1;
  a.group_query_attention = true;
  a.kv_channels = 6;  // n * d != h
  return a;
}
// D: MQA with full rotary and LayerNorm + SwiGLU.
train::ModelArguments config_d() {
  train::ModelArguments a = config_c();
  a.position_embedding_type = "rope";
  a.kv_channels = 4;
  a.swiglu = true;
  a.ffn_hidden_size = 20;
  a.untie_embeddings_and_output_weights = true;
  return a;
}

// E: Qwen3 style: per-head RMSNorm of q and k before partial RoPE (--qk-layernorm), GQA, kv_channels 8.
train::ModelArguments config_e() {
  train::ModelArguments a = config_b();
  a.qk_layernorm = true;
  a.kv_channels = 8;
  return a;
}
// F: --qk-layernorm with multi-head attention and learned positions (the path that would otherwise read q, k,
// v inside the fused projection and skip the norms), RMSNorm.
train::ModelArguments config_f() {
  train::ModelArguments a = tiny_args();
  a.qk_layernorm = true;
  a.normalization = "RMSNorm";
  return a;
}
// G: --qk-layernorm with LayerNorm (weights and biases) under RoPE and MQA. (Without RoPE the key norm's bias
// would add the same vector to every key, which softmax cancels: no gradient.)
train::ModelArguments config_g() {
  train::ModelArguments a = config_d();
  a.qk_layernorm = true;
  return a;
}

using Batch = testing::ModelBatch;

// Random tokens/labels in [0, vocab) and a loss mask with some zeros, on the CPU.
Batch make_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  return testing::make_model_batch(cpu_context(), b, s, vocab, seed);
}

Tensor to_ctx(Context& ctx, const Tensor& host) {
  Tensor t = ctx.empty(host.shape(), host.dtype());
  copy_tensor(ctx, t, host);
  return t;
}

// Replaces every parameter by random values of a useful size (norm weights around 1), so no gradient
// is trivially zero or symmetric.
void randomize(Context& ctx, GPTModel& model, double std) {
  for (Parameter* p : model.parameters()) {
    const bool norm_weight = p->name.find("layernorm.weight") != std::string::npos;
    ops::fill_normal(ctx, p->value, 99, parameter_name_hash(p->name), norm_weight ? 1.0 : 0.0, std);
  }
}

// Central differences of forward_loss against main_grad, on up to `max_elements` elements per parameter.
void expect_gradients_match_fd(const train::ModelArguments& args, double max_rel_error = 1e-6) {
  Context& ctx = cpu_context();
  GPTModel model(ctx, train::transformer_config(args, DType::F64, 1234));
  randomize(ctx, model, 0.3);
  const Batch batch = make_batch(2, args.seq_length, args.vocab_size, seed_from("fd"));
  ParameterList params = model.parameters();
  zero_grads(ctx, params);
  const double loss = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask);
  EXPECT_NEAR(model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask), loss, 1e-12);

  const int max_elements = 40;
  const double step = 1e-5;
  for (Parameter* p : params) {
    const int64_t n = p->value.numel();
    double* value = p->value.data<double>();
    const double* grad = p->main_grad.data<double>();
    const int64_t count = std::min<int64_t>(n, max_elements);
    double err2 = 0, ref2 = 0;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t i = (n <= max_elements) ? k : (k * 7919 + 13) % n;  // spread over the tensor
      const double saved = value[i];
      value[i] = saved + step;
      const double up = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
      value[i] = saved - step;
      const double down = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
      value[i] = saved;
      const double numeric = (up - down) / (2 * step);
      err2 += (grad[i] - numeric) * (grad[i] - numeric);
      ref2 += numeric * numeric;
    }
    ASSERT_GT(ref2, 1e-16) << p->name << ": finite differences see no gradient";
    EXPECT_LE(std::sqrt(err2 / ref2), max_rel_error) << p->name;
  }
}

TEST(GptModelGrad, LearnedLayerNormGeluTiedBias) { expect_gradients_match_fd(config_a()); }
TEST(GptModelGrad, RopeHalfRmsNormSwigluGqaUntiedNoBias) { expect_gradients_match_fd(config_b()); }
TEST(GptModelGrad, MqaNoPositionsKvChannels6) { expect_gradients_match_fd(config_c()); }
TEST(GptModelGrad, MqaRopeSwigluUntied) { expect_gradients_match_fd(config_d()); }
TEST(GptModelGrad, QkLayernormRmsRopeGqa) { expect_gradients_match_fd(config_e()); }
TEST(GptModelGrad, QkLayernormRmsLearnedMha) { expect_gradients_match_fd(config_f()); }
TEST(GptModelGrad, QkLayernormLayerNormRopeMqa) { expect_gradients_match_fd(config_g()); }

// --apply-layernorm-1p: every norm weight is stored centred on 0 and scales by 1 + w. A fresh model's norm weights
// are 0; a model whose norm weights are another's minus 1 (all else equal) computes the same loss and the same
// gradient of every parameter, for LayerNorm (with its bias) and RMSNorm; its gradients match finite differences.
TEST(GptModel, ApplyLayernorm1pIsTheSameFunctionWithNormWeightsMinusOne) {
  Context& ctx = cpu_context();
  for (train::ModelArguments args : {config_a(), config_b()}) {
    SCOPED_TRACE(args.normalization);
    GPTModel plain(ctx, train::transformer_config(args, DType::F64, 1234));
    args.apply_layernorm_1p = true;
    GPTModel centred(ctx, train::transformer_config(args, DType::F64, 1234));
    int norms = 0;
    for (Parameter* p : centred.parameters())
      if (p->name.ends_with("layernorm.weight")) {
        ++norms;
        for (double v : to_doubles(ctx, p->value)) ASSERT_EQ(v, 0.0) << p->name;
      }
    EXPECT_EQ(norms, 2 * args.num_layers + 1);
    randomize(ctx, plain, 0.3);
    const ParameterList from = plain.parameters(), to = centred.parameters();
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) {
      ops::copy(ctx, to[i]->value, from[i]->value);
      if (to[i]->name.ends_with("layernorm.weight")) {
        Tensor ones = ctx.empty(to[i]->value.shape(), DType::F64);
        ops::fill(ctx, ones, 1.0);
        ops::axpby(ctx, to[i]->value, from[i]->value, ones, 1.0, -1.0);
      }
    }
    const Batch batch = make_batch(2, args.seq_length, args.vocab_size, seed_from("1p"));
    zero_grads(ctx, from);
    zero_grads(ctx, to);
    const double loss = plain.forward_backward(ctx, batch.tokens, batch.labels, batch.mask);
    EXPECT_NEAR(centred.forward_backward(ctx, batch.tokens, batch.labels, batch.mask), loss, 1e-12 * std::abs(loss));
    for (size_t i = 0; i < from.size(); ++i) {
      const std::vector<double> want = to_doubles(ctx, from[i]->main_grad), got = to_doubles(ctx, to[i]->main_grad);
      for (size_t k = 0; k < want.size(); ++k) ASSERT_NEAR(got[k], want[k], 1e-10) << to[i]->name << " " << k;
    }
    expect_gradients_match_fd(args);
  }
}

TEST(GptModel, ParameterNamesAndWeightDecayGroups) {
  Context& ctx = cpu_context();
  GPTModel model(ctx, train::transformer_config(config_a(), DType::F32, 1));
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : model.parameters()) by_name[p->name] = p;
  const std::string l1 = "decoder.layers.1.";
  for (const char* name : {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                           "decoder.final_layernorm.weight", "decoder.final_layernorm.bias"})
    EXPECT_TRUE(by_name.count(name)) << name;
  for (const char* suffix : {"input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_qkv.weight",
                             "self_attention.linear_qkv.bias", "self_attention.linear_proj.weight",
                             "self_attention.linear_proj.bias", "pre_mlp_layernorm.weight",
                             "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
                             "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"})
    EXPECT_TRUE(by_name.count(l1 + suffix)) << l1 + suffix;
  EXPECT_EQ(by_name.size(), size_t(4 + 2 * 12));  // tied: no output_layer.weight
  for (auto& [name, p] : by_name) {
    const bool one_dim = p->value.rank() == 1;
    EXPECT_EQ(p->no_weight_decay, one_dim) << name;
    EXPECT_EQ(p->main_grad.dtype(), DType::F32) << name;
    EXPECT_EQ(p->main_grad.shape(), p->value.shape()) << name;
  }
  EXPECT_EQ(by_name["embedding.word_embeddings.weight"]->value.shape(), Shape({40, 16}));
  EXPECT_EQ(by_name["decoder.layers.0.self_attention.linear_qkv.weight"]->value.shape(), Shape({48, 16}));
  EXPECT_EQ(by_name["decoder.layers.0.mlp.linear_fc1.weight"]->value.shape(), Shape({64, 16}));

  GPTModel untied(ctx, train::transformer_config(config_b(), DType::F32, 1));
  std::set<std::string> names;
  for (Parameter* p : untied.parameters()) names.insert(p->name);
  EXPECT_TRUE(names.count("output_layer.weight"));
  EXPECT_FALSE(names.count("embedding.position_embeddings.weight"));
  EXPECT_FALSE(names.count("decoder.layers.0.self_attention.linear_qkv.bias"));
  EXPECT_FALSE(names.count("decoder.layers.0.input_layernorm.bias"));  // RMSNorm
  // GQA 4 heads / 2 groups, d 4: 2 * (2 + 2) * 4 rows; SwiGLU fc1 2 * 24.
  EXPECT_EQ(untied.layers[0].self_attention.linear_qkv.weight.value.shape(), Shape({32, 16}));
  EXPECT_EQ(untied.layers[0].mlp.linear_fc1.weight.value.shape(), Shape({48, 16}));
}

// An untrained model predicts (nearly) uniformly over the padded vocabulary: loss ~ ln(padded V).
TEST(GptModel, UntrainedLossIsLogVocab) {
  Context& ctx = cpu_context();
  for (const train::ModelArguments& base : {config_a(), config_b()}) {
    train::ModelArguments args = base;
    args.hidden_size = 64;
    args.kv_channels = 0;
    args.ffn_hidden_size = 128;
    args.vocab_size = 500;
    GPTModel model(ctx, train::transformer_config(args, DType::F32, 7));
    const Batch batch = make_batch(16, args.seq_length, args.vocab_size, seed_from("untrained"));
    const double loss = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
    // Logits have std ~0.1-0.3 at init: E[loss] = ln V + O(var); ~100 tokens average the noise.
    EXPECT_NEAR(loss, std::log(double(model.config().padded_vocab_size)), 0.05);
    std::cout << "untrained loss " << loss << " vs ln(" << model.config().padded_vocab_size << ") = "
              << std::log(double(model.config().padded_vocab_size)) << "\n";
  }
}

// Megatron's init: weights N(0, std), linear_proj / linear_fc2 N(0, std / sqrt(2 L)), biases 0, norms 1.
TEST(GptModel, MegatronInitStdPerParameterKind) {
  Context& ctx = cpu_context();
  train::ModelArguments args = config_a();
  args.num_layers = 4;
  args.hidden_size = 128;
  args.vocab_size = 1000;
  args.seq_length = 64;
  args.init_method_std = 0.05;
  args.untie_embeddings_and_output_weights = true;
  GPTModel model(ctx, train::transformer_config(args, DType::F32, 3));
  const double std = 0.05, scaled = 0.05 / std::sqrt(2.0 * 4);
  std::vector<double> first_qkv;
  for (Parameter* p : model.parameters()) {
    const std::vector<double> v = to_doubles(ctx, p->value);
    double sum = 0, sum2 = 0;
    for (double x : v) sum += x, sum2 += x * x;
    const double n = double(v.size()), mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    const std::string& name = p->name;
    const bool is_bias = name.ends_with(".bias");
    const bool is_norm = name.find("layernorm") != std::string::npos;
    if (is_bias) {
      for (double x : v) ASSERT_EQ(x, 0.0) << name;
    } else if (is_norm) {
      for (double x : v) ASSERT_EQ(x, 1.0) << name;
    } else {
      const bool out_proj = name.find("linear_proj") != std::string::npos || name.find("linear_fc2") != std::string::npos;
      const double expected = out_proj ? scaled : std;
      EXPECT_NEAR(sd, expected, 0.03 * expected) << name << " (" << v.size() << " values)";
      EXPECT_LT(std::abs(mean), 5 * expected / std::sqrt(n)) << name;
      if (name == "decoder.layers.0.self_attention.linear_qkv.weight") first_qkv = v;
      if (name == "decoder.layers.1.self_attention.linear_qkv.weight") {
        ASSERT_EQ(first_qkv.size(), v.size());
        EXPECT_NE(first_qkv, v) << "each parameter draws its own Philox stream";
      }
    }
  }
  // Values depend only on (seed, name): a second model is bit-identical; another seed is not.
  GPTModel again(ctx, train::transformer_config(args, DType::F32, 3));
  GPTModel other(ctx, train::transformer_config(args, DType::F32, 4));
  EXPECT_EQ(to_doubles(ctx, again.output_weight().value), to_doubles(ctx, model.output_weight().value));
  EXPECT_NE(to_doubles(ctx, other.output_weight().value), to_doubles(ctx, model.output_weight().value));
}

// The fused QKV layout: SelfAttention equals attention computed with plain loops from Megatron's layout
// (per query group: n/g query heads, one key head, one value head), for MHA, GQA and MQA.
TEST(GptModel, FusedQkvLayoutMatchesPlainLoopAttention) {
  Context& ctx = cpu_context();
  for (int groups : {4, 2, 1}) {
    train::ModelArguments args = tiny_args();
    args.position_embedding_type = "none";
    args.num_query_groups = groups;
    args.kv_channels = 6;
    const TransformerConfig config = train::transformer_config(args, DType::F64, 5);
    SelfAttention attn(ctx, "attn", config);
    ParameterList params;
    attn.collect_parameters(params);
    for (Parameter* p : params) ops::fill_normal(ctx, p->value, 11, parameter_name_hash(p->name), 0.0, 0.4);
    const int64_t B = 2, S = 5, H = 16, n = 4, g = groups, d = 6, r = n / g;
    Tensor x = ctx.empty({B, S, H}, DType::F64);
    testing::fill_random(x, seed_from("qkv_x"));
    Tensor out = ctx.empty({B, S, H}, DType::F64);
    const AttentionSaved saved = attn.forward(ctx, out, x);  // (only the output is checked)

    const double* X = x.data<double>();
    const double* Wqkv = attn.linear_qkv.weight.value.data<double>();
    const double* bqkv = attn.linear_qkv.bias.value.data<double>();
    const double* Wp = attn.linear_proj.weight.value.data<double>();
    const double* bp = attn.linear_proj.bias.value.data<double>();
    const int64_t rows = g * (r + 2) * d;
    auto proj = [&](int64_t b, int64_t s, int64_t row) {
      double acc = bqkv[row];
      for (int64_t c = 0; c < H; ++c) acc += X[(b * S + s) * H + c] * Wqkv[row * H + c];
      return acc;
    };
    double max_err = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> o(size_t(n * d), 0.0);
        for (int64_t head = 0; head < n; ++head) {
          const int64_t grp = head / r, qrow = grp * (r + 2) * d + (head % r) * d;
          const int64_t krow = grp * (r + 2) * d + r * d, vrow = krow + d;
          ASSERT_LE(vrow + d, rows);
          std::vector<double> score(size_t(i + 1));
          double mx = -1e300;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += proj(b, i, qrow + c) * proj(b, j, krow + c);
            score[size_t(j)] = dot / std::sqrt(double(d));
            mx = std::max(mx, score[size_t(j)]);
          }
          double z = 0;
          for (double& sc : score) z += (sc = std::exp(sc - mx));
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t c = 0; c < d; ++c) o[size_t(head * d + c)] += score[size_t(j)] / z * proj(b, j, vrow + c);
        }
        for (int64_t k = 0; k < H; ++k) {
          double ref = bp[k];
          for (int64_t c = 0; c < n * d; ++c) ref += o[size_t(c)] * Wp[k * n * d + c];
          max_err = std::max(max_err, std::abs(ref - out.data<double>()[(b * S + i) * H + k]));
        }
      }
    // The op keeps its LSE statistics in fp32, so even F64 attention agrees to ~1e-7 only; a layout
    // mistake is an O(1) error.
    EXPECT_LT(max_err, 1e-6) << "groups " << groups;
  }
}

TEST(GptModel, GradientsAccumulateAndScale) {
  Context& ctx = cpu_context();
  GPTModel model(ctx, train::transformer_config(config_b(), DType::F64, 2));
  const Batch batch = make_batch(2, 8, 37, seed_from("acc"));
  ParameterList params = model.parameters();
  zero_grads(ctx, params);
  model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask);
  std::vector<std::vector<double>> once;
  for (Parameter* p : params) once.push_back(to_doubles(ctx, p->main_grad));
  model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.grad_scale = 0.5});
  double mask_sum = 0;
  for (int64_t i = 0; i < batch.mask.numel(); ++i) mask_sum += batch.mask.data<float>()[i];
  // A caller-given denominator (e.g. the global token count): 4 * sum(mask) -> a quarter of the gradient.
  model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.loss_denominator = 4 * mask_sum});
  for (size_t k = 0; k < params.size(); ++k) {
    const std::vector<double> now = to_doubles(ctx, params[k]->main_grad);
    for (size_t i = 0; i < now.size(); ++i) ASSERT_NEAR(now[i], 1.75 * once[k][i], 1e-12 * (1 + std::abs(now[i])))
        << params[k]->name;
  }
}

// Recomputation drops what it promises: the peak above the model state of a forward-backward falls with
// selective recomputation of the MLPs (their pre-activations and activations are not kept) and far more with
// full recomputation (each layer keeps only its input), while the gradients stay bitwise (test_recompute_mpi).
TEST(GptModel, RecomputationLowersTheActivationPeak) {
  Context& ctx = cpu_context();
  train::ModelArguments args = config_b();
  args.num_layers = 8;
  args.hidden_size = 64;
  args.ffn_hidden_size = 256;
  args.seq_length = 64;
  const Batch batch = make_batch(4, args.seq_length, args.vocab_size, seed_from("recompute"));
  auto peak_of = [&](RecomputeConfig recompute) {
    TransformerConfig config = train::transformer_config(args, DType::F32, 3);
    config.recompute = recompute;
    GPTModel model(ctx, config);
    const size_t state = ctx.allocator().stats().allocated_bytes;
    ctx.allocator().reset_peak_stats();
    model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask);
    return double(ctx.allocator().stats().peak_allocated_bytes - state);
  };
  const double none = peak_of({});
  const double mlp = peak_of({.granularity = RecomputeGranularity::Selective, .mlp = true});
  const double norms = peak_of({.granularity = RecomputeGranularity::Selective, .layernorm = true});
  const double norms_mlp = peak_of({.granularity = RecomputeGranularity::Selective, .mlp = true, .layernorm = true});
  const double full = peak_of({.granularity = RecomputeGranularity::Full, .num_layers = 1});
  const double block = peak_of({.granularity = RecomputeGranularity::Full, .method = RecomputeMethod::Block,
                                .num_layers = 4});
  std::cout << "activation peak (MB): none " << none / 1e6 << ", selective mlp " << mlp / 1e6 << ", layernorm "
            << norms / 1e6 << ", layernorm + mlp " << norms_mlp / 1e6 << ", full block 4 " << block / 1e6
            << ", full uniform 1 " << full / 1e6 << "\n";
  EXPECT_LT(mlp, 0.8 * none);
  EXPECT_LT(norms, 0.95 * none);  // two hidden-sized tensors a layer
  EXPECT_LT(norms_mlp, mlp);
  EXPECT_LT(full, 0.35 * none);
  EXPECT_LT(full, block);
  EXPECT_LT(block, 0.75 * none);
}

TEST(GptModel, HiddenDropoutMasksDependOnTheStep) {
  Context& ctx = cpu_context();
  train::ModelArguments args = config_a();
  args.hidden_dropout = 0.2;
  GPTModel model(ctx, train::transformer_config(args, DType::F64, 2));
  const Batch batch = make_batch(2, 8, 37, seed_from("dropout"));
  const double eval = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
  const double s0 = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = 0});
  const double s0_again = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = 0});
  const double s1 = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = 1});
  EXPECT_EQ(s0, s0_again);
  EXPECT_NE(s0, s1);
  EXPECT_NE(s0, eval);
  EXPECT_EQ(model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask), eval);  // eval: no dropout

  args.hidden_dropout = 0.0;
  GPTModel plain(ctx, train::transformer_config(args, DType::F64, 2));
  EXPECT_EQ(plain.forward_loss(ctx, batch.tokens, batch.labels, batch.mask), eval);
}

TEST(GptModel, ConfigurationErrorsListEveryProblem) {
  train::ModelArguments args = tiny_args();
  args.attention_dropout = 1.0;
  args.num_query_groups = 3;
  args.normalization = "BatchNorm";
  testing::expect_error([&] { train::transformer_config(args, DType::F32, 1); },
                        {"--attention-dropout 1 must be in [0, 1)", "--num-query-groups 3", "BatchNorm"});
}

// ---- GPU (the lead runs these on an H100) ----

train::ModelArguments gpu_args(bool llama) {
  train::ModelArguments a = llama ? config_b() : config_a();
  a.seq_length = 64;
  a.hidden_size = llama ? 256 : 128;
  a.num_attention_heads = llama ? 4 : 2;  // head dim 64
  a.kv_channels = 0;
  a.ffn_hidden_size = llama ? 384 : 512;
  a.vocab_size = 1000;
  a.init_method_std = 0.05;
  return a;
}

TEST(GptModelGpu, F32OnCudaIsRejectedClearly) {
  MEGATRON_REQUIRE_GPU();
  testing::expect_error([&] { GPTModel m(testing::cuda_context(), train::transformer_config(gpu_args(false), DType::F32, 1)); },
                        {"GPTModel", "not supported on CUDA", "bf16"});
}

// A BF16 (or F16) model on `gpu` (CUDA, or the CPU for CI) against the CPU F32 model from the same rounded
// weights.
void expect_bf16_matches_cpu_f32(Context& gpu, const train::ModelArguments& args, DType narrow = DType::BF16) {
  Context& cpu = cpu_context();
  GPTModel cuda_model(gpu, train::transformer_config(args, narrow, 42));
  GPTModel cpu_model(cpu, train::transformer_config(args, DType::F32, 42));
  ParameterList gp = cuda_model.parameters(), cp = cpu_model.parameters();
  ASSERT_EQ(gp.size(), cp.size());
  for (size_t k = 0; k < gp.size(); ++k) {  // the CPU reference starts from the bf16-rounded weights
    ASSERT_EQ(gp[k]->name, cp[k]->name);
    Tensor host = cpu.empty(gp[k]->value.shape(), narrow);
    copy_tensor(gpu, host, gp[k]->value);
    ops::cast(cpu, cp[k]->value, host);
  }
  const Batch batch = make_batch(2, args.seq_length, args.vocab_size, seed_from("gpu"));
  zero_grads(gpu, gp);
  zero_grads(cpu, cp);
  const double gpu_loss = cuda_model.forward_backward(gpu, to_ctx(gpu, batch.tokens), to_ctx(gpu, batch.labels),
                                                      to_ctx(gpu, batch.mask));
  const double cpu_loss = cpu_model.forward_backward(cpu, batch.tokens, batch.labels, batch.mask);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-2 * cpu_loss);
  double worst = 0;
  std::string worst_name;
  for (size_t k = 0; k < gp.size(); ++k) {
    const double e = testing::nmse(to_doubles(gpu, gp[k]->main_grad), to_doubles(cpu, cp[k]->main_grad));
    EXPECT_LE(e, 1e-3) << gp[k]->name;
    if (e >= worst) worst = e, worst_name = gp[k]->name;
  }
  std::cout << "loss " << gpu_loss << " (" << dtype_name(narrow) << ") vs " << cpu_loss << " (f32); worst gradient nmse " << worst << " ("
            << worst_name << ")\n";
}

TEST(GptModelGpu, Bf16MatchesCpuF32Gpt2Style) {
  MEGATRON_REQUIRE_GPU();
  expect_bf16_matches_cpu_f32(testing::cuda_context(), gpu_args(false));
}
TEST(GptModelGpu, Bf16MatchesCpuF32LlamaStyle) {
  MEGATRON_REQUIRE_GPU();
  expect_bf16_matches_cpu_f32(testing::cuda_context(), gpu_args(true));
}
TEST(GptModelGpu, Bf16MatchesCpuF32Qwen3Style) {  // --qk-layernorm: the split, per-head norms, then RoPE
  MEGATRON_REQUIRE_GPU();
  train::ModelArguments args = gpu_args(true);
  args.qk_layernorm = true;
  expect_bf16_matches_cpu_f32(testing::cuda_context(), args);
}
TEST(GptModelGpu, F16MatchesCpuF32BothStyles) {
  MEGATRON_REQUIRE_GPU();
  expect_bf16_matches_cpu_f32(testing::cuda_context(), gpu_args(false), DType::F16);
  expect_bf16_matches_cpu_f32(testing::cuda_context(), gpu_args(true), DType::F16);
}

// The BF16 and F16 plumbing (narrow activations, F32 main grads and statistics) on the CPU reference ops.
TEST(GptModel, CpuBf16AndF16MatchCpuF32) {
  for (DType narrow : {DType::BF16, DType::F16})
  for (bool llama : {false, true}) {
    train::ModelArguments args = llama ? config_b() : config_a();
    args.hidden_size = 32;
    args.ffn_hidden_size = 64;
    args.vocab_size = 100;
    args.seq_length = 16;
    args.init_method_std = 0.05;
    expect_bf16_matches_cpu_f32(cpu_context(), args, narrow);
  }
}

TEST(GptModel, AllZeroLossMaskGivesNoGradient) {
  Context& ctx = cpu_context();
  GPTModel model(ctx, train::transformer_config(config_a(), DType::F64, 2));
  Batch batch = make_batch(2, 8, 37, seed_from("zero"));
  ops::fill(ctx, batch.mask, 0.0);
  ParameterList params = model.parameters();
  zero_grads(ctx, params);
  EXPECT_EQ(model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask), 0.0);
  for (Parameter* p : params)
    for (double g : to_doubles(ctx, p->main_grad)) ASSERT_EQ(g, 0.0) << p->name;
}

}  // namespace
}  // namespace megatron::nn
