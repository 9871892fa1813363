// Hugging Face conversion without Python: HF-named tensors made here (Llama with GQA and untied output,
// Mistral, Qwen2 with q/k/v biases and tied embeddings, GPT-2 with Conv1D weights, Mixtral with 4 experts, Qwen3
// with q/k norms, Qwen3-MoE with a dense layer, Qwen2-MoE with a gated shared expert), imported into a
// megatron.cpp checkpoint and exported back, give byte-identical tensors; the fused QKV rows, fc1 = [gate; up]
// and the stacked experts follow Megatron's layout; transformers 5's fused expert layout reads to the same
// tensors; the Qwen MoE families' sparse-step, dense-layer, router and shared-expert options map to Megatron's;
// unsupported configurations and stray tensors are refused by name; a converted Mixtral loads as a model with
// MoE layers and runs a forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include "harness.h"
#include "hf_test_models.h"
#include "megatron/checkpoint/hf_checkpoint.h"
#include "megatron/checkpoint/model_loader.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/inference/gpt_inference.h"
#include "megatron/train/model_config.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace testmodels;

void write_hf_dir(const fs::path& dir, const json& config, const TensorMap& t) { write_hf_checkpoint(dir, config, t); }

struct RoundTripCase {
  std::string name;
  json config;
  DType dtype;
};

class HfRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(HfRoundTrip, ImportThenExportGivesIdenticalBytes) {
  const RoundTripCase& c = GetParam();
  fs::path dir = testing::make_temp_dir("hf_rt_" + c.name);
  const TensorMap original = hf_tensors(c.config, c.dtype);
  write_hf_dir(dir / "hf", c.config, original);
  ImportSummary in = import_hf_checkpoint(dir / "hf", dir / "ours", 2, std::nullopt, 2);
  EXPECT_EQ(in.padded_vocab, 256) << "vocab padded to a multiple of 128 x TP 2";
  CheckpointReader r = CheckpointReader::open(dir / "ours");
  EXPECT_TRUE(r.is_release());
  EXPECT_EQ(r.state()["converted_from"]["target_tensor_parallel_size"], 2);
  EXPECT_EQ(r.state()["converted_from"]["target_pipeline_parallel_size"], 2);
  testing::expect_error([&] { import_hf_checkpoint(dir / "hf", dir / "ours3", 1, std::nullopt, 3); },
                        {"--target-pipeline-parallel-size 3", "divisible"});
  EXPECT_EQ(r.tensor("embedding.word_embeddings.weight").global_shape[0], 256);

  ExportSummary out = export_hf_checkpoint(dir / "ours", dir / "back");
  EXPECT_TRUE(out.warnings.empty());
  EXPECT_EQ(hf_family_name(out.family), c.config["model_type"].get<std::string>());
  const TensorMap back = read_hf_weights(dir / "back");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).shape, t.shape) << name;
    EXPECT_EQ(back.at(name).dtype, t.dtype) << name;
    EXPECT_TRUE(back.at(name).bytes == t.bytes) << name << " differs after the round trip";
  }
  // The tensor files are byte-identical too (same writer, same canonical order).
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(dir / "back" / "model.safetensors"), slurp(dir / "hf" / "model.safetensors"));
  const json config = read_hf_config(dir / "back");
  for (const auto& [k, v] : c.config.items())
    if (!v.is_null()) {
      EXPECT_EQ(config[k], v) << "config.json field " << k;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfRoundTrip,
    ::testing::Values(RoundTripCase{"llama_gqa_untied_bf16", llama_config("llama", false, 2), DType::BF16},
                      RoundTripCase{"mistral_mqa_f32", llama_config("mistral", false, 1), DType::F32},
                      RoundTripCase{"qwen2_tied_qkv_bias", llama_config("qwen2", true, 2), DType::BF16},
                      RoundTripCase{"gpt2", gpt2_config(), DType::F32},
                      RoundTripCase{"mixtral_gqa_bf16", mixtral_config(2), DType::BF16},
                      RoundTripCase{"qwen3_head_dim_bf16", qwen3_config(2), DType::BF16},
                      RoundTripCase{"qwen3_moe_dense_layer_bf16", qwen3_moe_config(2), DType::BF16},
                      RoundTripCase{"qwen2_moe_shared_gate_bf16", qwen2_moe_config(2), DType::BF16}),
    [](const auto& info) { return info.param.name; });

// Element [row, 0] of a tensor whose rows were tagged with their source.
float first_of_row(const HostTensor& t, int64_t row) {
  return reinterpret_cast<const float*>(t.bytes.data())[row * (t.shape.size() > 1 ? t.shape[1] : 1)];
}

TEST(HfConvert, FusedQkvAndSwigluFollowMegatronsLayout) {
  json c = llama_config("llama", false, 2);  // 4 heads, 2 groups, d = 8
  TensorMap hf = hf_tensors(c, DType::F32);
  // Tag every row: q head k row r -> 1000 + 100 k + r; k group j -> 200 + 10 j + r; v -> 300 + ...; gate 400 + r, up 500 + r.
  auto tag = [&](const std::string& name, auto value_of_row) {
    HostTensor& t = hf.at(name);
    float* p = reinterpret_cast<float*>(t.bytes.data());
    for (int64_t r = 0; r < t.shape[0]; ++r)
      for (int64_t j = 0; j < t.shape[1]; ++j) p[r * t.shape[1] + j] = value_of_row(r);
  };
  tag("model.layers.0.self_attn.q_proj.weight", [](int64_t r) { return float(1000 + 100 * (r / 8) + r % 8); });
  tag("model.layers.0.self_attn.k_proj.weight", [](int64_t r) { return float(200 + 10 * (r / 8) + r % 8); });
  tag("model.layers.0.self_attn.v_proj.weight", [](int64_t r) { return float(300 + 10 * (r / 8) + r % 8); });
  tag("model.layers.0.mlp.gate_proj.weight", [](int64_t r) { return float(400 + r); });
  tag("model.layers.0.mlp.up_proj.weight", [](int64_t r) { return float(500 + r); });
  const train::Arguments a = arguments_from_hf(c);
  const train::ModelArguments& m = a.model;
  EXPECT_EQ(m.num_query_groups, 2);
  EXPECT_EQ(m.kv_channels, 8);
  EXPECT_TRUE(m.swiglu);
  EXPECT_EQ(m.normalization, "RMSNorm");
  EXPECT_EQ(m.rotary_base, 50000.0);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights);
  EXPECT_TRUE(m.disable_bias_linear);
  TensorMap ours = hf_to_megatron(HfFamily::Llama, a, 128, hf);
  const HostTensor& qkv = ours.at("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_EQ(qkv.shape, (std::vector<int64_t>{2 * (2 + 2) * 8, 32}));
  // Group 0: q heads 0, 1; k 0; v 0.  Group 1: q heads 2, 3; k 1; v 1 (8 rows each).
  const float want[8] = {1000, 1100, 200, 300, 1200, 1300, 210, 310};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(first_of_row(qkv, 8 * i), want[i]) << "block " << i;
  EXPECT_EQ(first_of_row(qkv, 9), 1101.0f);  // q head 1, row 1
  const HostTensor& fc1 = ours.at("decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(first_of_row(fc1, 0), 400.0f);
  EXPECT_EQ(first_of_row(fc1, 47), 447.0f);
  EXPECT_EQ(first_of_row(fc1, 48), 500.0f);
  // The embedding is padded with zero rows to 128.
  const HostTensor& emb = ours.at("embedding.word_embeddings.weight");
  EXPECT_EQ(emb.shape[0], 128);
  EXPECT_EQ(first_of_row(emb, 127), 0.0f);
}

TEST(HfConvert, Gpt2Conv1DWeightsAreTransposedAndCAttnSplit) {
  json c = gpt2_config();
  TensorMap hf = hf_tensors(c, DType::F32);
  HostTensor& w = hf.at("transformer.h.0.attn.c_attn.weight");  // [h, 3h]: column j of q/k/v
  float* p = reinterpret_cast<float*>(w.bytes.data());
  for (int64_t i = 0; i < 32; ++i)
    for (int64_t j = 0; j < 96; ++j) p[i * 96 + j] = float(j * 1000 + i);
  const train::Arguments a = arguments_from_hf(c);
  const train::ModelArguments& m = a.model;
  EXPECT_EQ(m.ffn_hidden_size, 128);
  EXPECT_EQ(m.position_embedding_type, "learned_absolute");
  EXPECT_FALSE(m.untie_embeddings_and_output_weights);
  TensorMap ours = hf_to_megatron(HfFamily::GPT2, a, 128, hf);
  const HostTensor& qkv = ours.at("decoder.layers.0.self_attention.linear_qkv.weight");  // [3h, h]
  const float* q = reinterpret_cast<const float*>(qkv.bytes.data());
  // Head 1's rows (group 1 = head 1): q columns 8..15, k columns 32+8.., v columns 64+8..
  EXPECT_EQ(q[(24 + 0) * 32 + 5], float(8 * 1000 + 5));
  EXPECT_EQ(q[(24 + 8) * 32 + 5], float((32 + 8) * 1000 + 5));
  EXPECT_EQ(q[(24 + 16) * 32 + 5], float((64 + 8) * 1000 + 5));
}

TEST(HfConvert, RefusesWhatItCannotRepresent) {
  json c = llama_config("llama", false, 2);
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  testing::expect_error([&] { arguments_from_hf(c); }, {"RoPE scaling 'llama3'"});
  c = llama_config("llama", false, 2);
  c["hidden_act"] = "gelu";
  testing::expect_error([&] { arguments_from_hf(c); }, {"hidden_act 'gelu'"});
  c["model_type"] = "bert";
  testing::expect_error([&] { arguments_from_hf(c); }, {"model type \"bert\" is not supported"});
  c = llama_config("llama", false, 2);
  TensorMap hf = hf_tensors(c, DType::F32);
  hf["model.layers.0.self_attn.q_norm.weight"] = random_tensor({8}, DType::F32, 9);
  testing::expect_error([&] { hf_to_megatron(HfFamily::Llama, arguments_from_hf(c), 128, hf); },
                        {"does not use", "q_norm"});
  hf.erase("model.layers.0.self_attn.q_norm.weight");
  hf.erase("model.layers.1.mlp.up_proj.weight");
  testing::expect_error([&] { hf_to_megatron(HfFamily::Llama, arguments_from_hf(c), 128, hf); },
                        {"no tensor 'model.layers.1.mlp.up_proj.weight'", "[48, 32]"});
}

// Qwen2 has biases on q, k and v only: the import says --add-qkv-bias (not a bias on every linear), so the
// checkpoint holds linear_qkv's bias and no zero biases on the other linears.
TEST(HfConvert, Qwen2ImportsBiasesOnQkvOnly) {
  const json c = llama_config("qwen2", true, 2);
  const train::Arguments a = arguments_from_hf(c);
  EXPECT_TRUE(a.model.disable_bias_linear);
  EXPECT_TRUE(a.model.add_qkv_bias);
  const TensorMap ours = hf_to_megatron(HfFamily::Qwen2, a, 128, hf_tensors(c, DType::F32));
  for (int i = 0; i < 2; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    EXPECT_EQ(ours.count(p + "self_attention.linear_qkv.bias"), 1u);
    for (const char* none : {"self_attention.linear_proj.bias", "mlp.linear_fc1.bias", "mlp.linear_fc2.bias"})
      EXPECT_EQ(ours.count(p + none), 0u) << p << none << " would be a made-up zero bias";
  }
  EXPECT_EQ(hf_config_from_model(HfFamily::Qwen2, a, DType::F32).value("model_type", ""), "qwen2");
}

// The imported Qwen2 builds with a bias on linear_qkv only, and its forward uses it: changing the bias
// changes the logits.
TEST(HfConvert, Qwen2ModelHasOnlyTheQkvBias) {
  fs::path dir = testing::make_temp_dir("hf_qwen2_model");
  const json c = llama_config("qwen2", true, 2);
  write_hf_dir(dir / "hf", c, hf_tensors(c, DType::F32));
  import_hf_checkpoint(dir / "hf", dir / "ours");
  LoadedModel loaded = load_model(testing::cpu_context(), dir / "ours", DType::F32);
  Context& cpu = testing::cpu_context();
  for (auto& layer : loaded.model->layers) {
    EXPECT_TRUE(layer.self_attention.linear_qkv.bias.defined());
    EXPECT_FALSE(layer.self_attention.linear_proj.bias.defined());
    EXPECT_FALSE(layer.mlp.linear_fc1.bias.defined());
  }
  auto logits = [&] {
    inference::GPTInference engine(cpu, *loaded.model, 1, 8);
    Tensor tokens = cpu.empty({1, 5}, DType::I64);
    for (int64_t t = 0; t < 5; ++t) tokens.data<int64_t>()[t] = 3 * t + 1;
    return testing::to_doubles(cpu, engine.forward(cpu, tokens));
  };
  const std::vector<double> with_bias = logits();
  for (double x : with_bias) ASSERT_TRUE(std::isfinite(x));
  ops::fill(cpu, loaded.model->layers[0].self_attention.linear_qkv.bias.value, 0.0);
  EXPECT_NE(logits(), with_bias) << "the q/k/v bias takes part in the forward";
  fs::remove_all(dir);
}

// A checkpoint saved before the architecture flag `key` existed has no such arg: it loads as a model without the
// flag, and a model with it (`enable`) differs by exactly that flag.
void expect_checkpoints_without_load_as_without(const std::string& key, const std::string& flag,
                                                const std::function<void(nn::TransformerConfig&)>& enable) {
  nn::TransformerConfig config = train::transformer_config(arguments_from_hf(llama_config("llama", false, 2)).model,
                                                           DType::F32, 1);
  json saved = json::object();
  for (const auto& [k, value] : architecture_values(config)) saved[k] = value;
  saved.erase(key);
  EXPECT_TRUE(architecture_differences(saved, config).empty());
  enable(config);
  const std::vector<std::string> diffs = architecture_differences(saved, config);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].find(flag), std::string::npos) << diffs[0];
}

TEST(HfConvert, CheckpointsWithoutAddQkvBiasLoadAsWithout) {
  expect_checkpoints_without_load_as_without("add_qkv_bias", "--add-qkv-bias",
                                             [](nn::TransformerConfig& c) { c.add_qkv_bias = true; });
}

// --apply-layernorm-1p keeps every norm weight centred on 0: an import stores the HF scales minus 1 (every other
// tensor as without the flag) and the export adds the 1 back, for RMSNorm (Llama) and LayerNorm (GPT-2, whose
// biases are not shifted). The flag is part of a checkpoint's architecture; checkpoints from before it load as
// without.
TEST(HfConvert, ApplyLayernorm1pStoresTheNormScalesMinusOne) {
  for (const json& c : {llama_config("llama", false, 2), gpt2_config()}) {
    SCOPED_TRACE(c["model_type"].get<std::string>());
    const HfFamily family = hf_family_of(c);
    const TensorMap hf = hf_tensors(c, DType::F32);
    const train::Arguments plain = arguments_from_hf(c);
    train::Arguments centred = plain;
    centred.model.apply_layernorm_1p = true;
    const TensorMap ours = hf_to_megatron(family, plain, 128, hf), ours_1p = hf_to_megatron(family, centred, 128, hf);
    ASSERT_EQ(ours.size(), ours_1p.size());
    int norms = 0;
    for (const auto& [name, t] : ours) {
      const HostTensor& u = ours_1p.at(name);
      if (!name.ends_with("layernorm.weight")) {
        EXPECT_EQ(u.bytes, t.bytes) << name;
        continue;
      }
      ++norms;
      const float* want = reinterpret_cast<const float*>(t.bytes.data());
      const float* got = reinterpret_cast<const float*>(u.bytes.data());
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(got[i], float(double(want[i]) - 1.0)) << name << " " << i;
    }
    EXPECT_EQ(norms, 2 * c.value("num_hidden_layers", c.value("n_layer", 0)) + 1);
    const TensorMap back = megatron_to_hf(family, centred, ours_1p);
    ASSERT_EQ(back.size(), hf.size());
    for (const auto& [name, t] : hf) {
      const float* want = reinterpret_cast<const float*>(t.bytes.data());
      const float* got = reinterpret_cast<const float*>(back.at(name).bytes.data());
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << name << " " << i;
    }
  }
  expect_checkpoints_without_load_as_without("apply_layernorm_1p", "--apply-layernorm-1p",
                                             [](nn::TransformerConfig& c) { c.norm_zero_centered_gamma = true; });
}

// config.json fields of the wrong type or size (found by fuzz_hf_config): errors naming the field, not
// nlohmann's type_error, a narrowed integer or a division by zero.
TEST(HfConvert, ConfigFieldsOfTheWrongTypeOrSizeAreNamed) {
  json c = llama_config("llama", false, 2);
  c["num_attention_heads"] = 0;
  testing::expect_error([&] { arguments_from_hf(c); },
                        {"config.json gives sizes that must be positive: the attention heads (0)"});
  c = llama_config("llama", false, 2);
  c["hidden_size"] = "64";
  testing::expect_error([&] { arguments_from_hf(c); }, {"\"hidden_size\" must be an integer, got \"\\\"64\\\"\""});
  c = llama_config("llama", false, 2);
  c["intermediate_size"] = 3000000000LL;
  testing::expect_error([&] { arguments_from_hf(c); }, {"\"intermediate_size\" must be an integer, got \"3000000000\""});
  c = llama_config("llama", false, 2);
  c["rms_norm_eps"] = "small";
  testing::expect_error([&] { arguments_from_hf(c); }, {"\"rms_norm_eps\" must be a number"});
  c = llama_config("llama", false, 2);
  c.erase("vocab_size");
  testing::expect_error([&] { arguments_from_hf(c); }, {"config.json has no \"vocab_size\""});
  testing::expect_error([&] { hf_family_of(json::array()); }, {"config.json must be a JSON object, it is array"});
}

// A sharded checkpoint's index names its files: malformed JSON, a missing or non-object weight_map, a value that
// is not a string or not a plain file name in the directory are refused naming the index and the entry.
TEST(HfConvert, MalformedSafetensorsIndexIsRefusedByName) {
  const fs::path dir = testing::make_temp_dir("hf_index");
  auto refused = [&](const std::string& text, std::vector<std::string> parts) {
    std::ofstream(dir / "model.safetensors.index.json") << text;
    parts.insert(parts.begin(), "model.safetensors.index.json");
    testing::expect_error([&] { read_hf_weights(dir); }, parts);
  };
  refused("{\"weight_map\": ", {"is not valid JSON"});
  refused("{\"weight_map\": {\"a\": 1" + std::string(400, '0') + "}}", {"is not valid JSON", "number overflow"});
  refused("[1, 2]", {"needs a \"weight_map\" object"});
  refused(R"({"metadata": {}})", {"needs a \"weight_map\" object"});
  refused(R"({"weight_map": {"w": 3}})", {"weight_map.\"w\" must name a file (it is number)"});
  refused(R"({"weight_map": {"w": "../outside.safetensors"}})", {"weight_map.\"w\" must name a file in", "../outside"});
  fs::remove_all(dir);
}

// A model with a bias on every linear (trained so, then exported as Qwen2): the biases Qwen2 cannot hold are
// dropped, with a warning when they are not zero.
TEST(HfConvert, Qwen2ExportWarnsAboutBiasesItCannotHold) {
  json c = llama_config("qwen2", true, 2);
  train::Arguments a = arguments_from_hf(c);
  a.model.disable_bias_linear = false;
  a.model.add_qkv_bias = false;
  TensorMap ours = hf_to_megatron(HfFamily::Qwen2, a, 128, hf_tensors(c, DType::F32));
  float* b = reinterpret_cast<float*>(ours.at("decoder.layers.1.mlp.linear_fc2.bias").bytes.data());
  b[3] = 0.5f;  // learned after the import
  std::vector<std::string> warnings;
  megatron_to_hf(HfFamily::Qwen2, a, ours, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("decoder.layers.1.mlp.linear_fc2.bias"), std::string::npos);
}

TEST(HfMixtral, ConfigMapsToMoeArgumentsAndBack) {
  const json c = mixtral_config(2);
  const train::Arguments a = arguments_from_hf(c);
  EXPECT_EQ(a.moe.num_experts, 4);
  EXPECT_EQ(a.moe.moe_router_topk, 2);
  EXPECT_EQ(a.moe.moe_ffn_hidden_size, 48);
  EXPECT_EQ(a.model.ffn_hidden_size, 48);
  EXPECT_EQ(a.moe.moe_aux_loss_coeff, std::vector<double>{0.02});
  EXPECT_EQ(a.moe.moe_router_score_function, "softmax");
  EXPECT_FALSE(a.moe.moe_router_pre_softmax);  // Mixtral: top-k of the softmax, renormalised = top-k, then softmax
  EXPECT_EQ(a.moe.moe_layer_freq, "1");
  EXPECT_TRUE(a.model.swiglu);
  EXPECT_EQ(a.model.normalization, "RMSNorm");
  EXPECT_EQ(a.model.position_embedding_type, "rope");
  EXPECT_TRUE(a.model.untie_embeddings_and_output_weights);
  EXPECT_TRUE(a.model.disable_bias_linear);

  const json back = hf_config_from_model(HfFamily::Mixtral, a, DType::BF16);
  EXPECT_EQ(back["model_type"], "mixtral");
  EXPECT_EQ(back["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(back["num_local_experts"], 4);
  EXPECT_EQ(back["num_experts_per_tok"], 2);
  EXPECT_EQ(back["intermediate_size"], 48);
  EXPECT_EQ(back["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(back["router_jitter_noise"], 0.0);
  EXPECT_TRUE(back["sliding_window"].is_null());
  EXPECT_EQ(back["num_key_value_heads"], 2);
  EXPECT_EQ(back["torch_dtype"], "bfloat16");
}

// Rows tagged with (expert, matrix, row) in their first element.
void tag_rows(HostTensor& t, const std::function<float(int64_t)>& value_of_row) {
  float* p = reinterpret_cast<float*>(t.bytes.data());
  const int64_t cols = t.shape.back(), rows = t.numel() / cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) p[r * cols + j] = value_of_row(r);
}

TEST(HfMixtral, ExpertsStackAsMegatronsGroupedWeights) {
  const json c = mixtral_config(2);  // E = 4, F = 48, h = 32
  TensorMap hf = hf_tensors(c, DType::F32);
  const std::string moe = "model.layers.1.block_sparse_moe.";
  for (int e = 0; e < 4; ++e) {
    const std::string x = moe + "experts." + std::to_string(e) + ".";
    tag_rows(hf.at(x + "w1.weight"), [e](int64_t r) { return float(10000 * e + 1000 + r); });
    tag_rows(hf.at(x + "w3.weight"), [e](int64_t r) { return float(10000 * e + 3000 + r); });
    tag_rows(hf.at(x + "w2.weight"), [e](int64_t r) { return float(10000 * e + 2000 + r); });
  }
  tag_rows(hf.at(moe + "gate.weight"), [](int64_t r) { return float(500 + r); });
  const TensorMap ours = hf_to_megatron(HfFamily::Mixtral, arguments_from_hf(c), 128, hf);
  EXPECT_EQ(ours.count("decoder.layers.1.mlp.linear_fc1.weight"), 0u);
  const HostTensor& router = ours.at("decoder.layers.1.mlp.router.weight");
  ASSERT_EQ(router.shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(first_of_row(router, 3), 503.0f);
  const HostTensor& fc1 = ours.at("decoder.layers.1.mlp.experts.linear_fc1.weight");
  const HostTensor& fc2 = ours.at("decoder.layers.1.mlp.experts.linear_fc2.weight");
  ASSERT_EQ(fc1.shape, (std::vector<int64_t>{4, 96, 32}));
  ASSERT_EQ(fc2.shape, (std::vector<int64_t>{4, 32, 48}));
  const float* p1 = reinterpret_cast<const float*>(fc1.bytes.data());
  const float* p2 = reinterpret_cast<const float*>(fc2.bytes.data());
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(p1[(e * 96 + 0) * 32], float(10000 * e + 1000)) << "expert " << e << ": gate (w1) first";
    EXPECT_EQ(p1[(e * 96 + 47) * 32 + 31], float(10000 * e + 1047));
    EXPECT_EQ(p1[(e * 96 + 48) * 32], float(10000 * e + 3000)) << "expert " << e << ": then up (w3)";
    EXPECT_EQ(p1[(e * 96 + 95) * 32], float(10000 * e + 3047));
    EXPECT_EQ(p2[(e * 32 + 5) * 48 + 7], float(10000 * e + 2005)) << "expert " << e << ": w2 row 5";
  }
}

// transformers 5 holds the experts fused (mlp.experts.gate_up_proj [E, 2F, h] = [w1; w3] per expert,
// down_proj [E, h, F]) and writes them so with save_pretrained(save_original_format=False).
TEST(HfMixtral, FusedExpertLayoutReadsTheSameAsPerExpert) {
  const json c = mixtral_config(1);
  const TensorMap classic = hf_tensors(c, DType::BF16);
  TensorMap fused;
  for (const auto& [name, t] : classic)
    if (name.find(".block_sparse_moe.") == std::string::npos) fused[name] = t;
  const int64_t E = 4, F = 48, h = 32;
  for (int i = 0; i < 2; ++i) {
    const std::string from = "model.layers." + std::to_string(i) + ".block_sparse_moe.";
    const std::string to = "model.layers." + std::to_string(i) + ".mlp.";
    fused[to + "gate.weight"] = classic.at(from + "gate.weight");
    HostTensor gate_up = random_tensor({E, 2 * F, h}, DType::BF16, 0), down = random_tensor({E, h, F}, DType::BF16, 0);
    const size_t mat = size_t(F * h) * 2;  // bytes of one [F, h] bf16 matrix
    for (int e = 0; e < E; ++e) {
      const std::string x = from + "experts." + std::to_string(e) + ".";
      std::memcpy(gate_up.bytes.data() + 2 * e * mat, classic.at(x + "w1.weight").bytes.data(), mat);
      std::memcpy(gate_up.bytes.data() + (2 * e + 1) * mat, classic.at(x + "w3.weight").bytes.data(), mat);
      std::memcpy(down.bytes.data() + e * mat, classic.at(x + "w2.weight").bytes.data(), mat);
    }
    fused[to + "experts.gate_up_proj"] = gate_up;
    fused[to + "experts.down_proj"] = down;
  }
  const train::Arguments a = arguments_from_hf(c);
  const TensorMap want = hf_to_megatron(HfFamily::Mixtral, a, 128, classic);
  const TensorMap got = hf_to_megatron(HfFamily::Mixtral, a, 128, fused);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name).bytes == t.bytes && got.at(name).shape == t.shape) << name;
  }
  // Export writes the per-expert layout whichever was read.
  const TensorMap back = megatron_to_hf(HfFamily::Mixtral, a, got);
  EXPECT_TRUE(back.count("model.layers.0.block_sparse_moe.experts.3.w3.weight"));
  EXPECT_EQ(back.size(), classic.size());
}

TEST(HfMixtral, ConvertedModelLoadsWithMoeLayersAndRuns) {
  fs::path dir = testing::make_temp_dir("hf_mixtral_load");
  const json c = mixtral_config(2);
  write_hf_dir(dir / "hf", c, hf_tensors(c, DType::F32));
  import_hf_checkpoint(dir / "hf", dir / "ours");
  const train::Arguments saved = arguments_from_state(CheckpointReader::open(dir / "ours").state());
  EXPECT_EQ(saved.moe.num_experts, 4);
  EXPECT_EQ(saved.moe.moe_router_topk, 2);
  EXPECT_EQ(saved.moe.moe_ffn_hidden_size, 48);
  LoadedModel loaded = load_model(testing::cpu_context(), dir / "ours", DType::F32);
  ASSERT_EQ(loaded.model->layers.size(), 2u);
  for (const auto& layer : loaded.model->layers) EXPECT_TRUE(layer.moe.defined());
  EXPECT_EQ(loaded.model->config().moe.num_experts, 4);
  Context& cpu = testing::cpu_context();
  inference::GPTInference engine(cpu, *loaded.model, 1, 8);
  Tensor tokens = cpu.empty({1, 5}, DType::I64);
  for (int64_t t = 0; t < 5; ++t) tokens.data<int64_t>()[t] = 3 * t + 1;
  const std::vector<double> prefill = testing::to_doubles(cpu, engine.forward(cpu, tokens));
  for (double x : prefill) ASSERT_TRUE(std::isfinite(x));
  Tensor next = cpu.empty({1, 1}, DType::I64);
  next.data<int64_t>()[0] = 7;
  const std::vector<double> step = testing::to_doubles(cpu, engine.forward(cpu, next));
  EXPECT_EQ(step.size(), size_t(loaded.model->config().padded_vocab_size));
}

TEST(HfMixtral, RefusesWhatMixtralOrWeCannotExpress) {
  json c = mixtral_config(2);
  c["num_experts_per_tok"] = 1;
  testing::expect_error([&] { arguments_from_hf(c); }, {"num_experts_per_tok 1"});
  c = mixtral_config(2);
  c["router_jitter_noise"] = 0.1;
  testing::expect_error([&] { arguments_from_hf(c); }, {"router_jitter_noise 0.1"});
  c = mixtral_config(2);
  c["num_experts_per_tok"] = 5;
  testing::expect_error([&] { arguments_from_hf(c); }, {"--moe-router-topk 5", "--num-experts 4"});

  // A model with experts is not a Llama; Mixtral has no shared experts, dense layers or pre-softmax.
  train::Arguments a = arguments_from_hf(mixtral_config(2));
  testing::expect_error([&] { hf_config_from_model(HfFamily::Llama, a, DType::F32); },
                        {"MoE layers (--num-experts 4)", "export it as mixtral"});
  a.moe.moe_shared_expert_intermediate_size = 64;
  a.moe.moe_layer_freq = "[1,0]";
  a.moe.moe_router_pre_softmax = true;
  testing::expect_error([&] { hf_config_from_model(HfFamily::Mixtral, a, DType::F32); },
                        {"not Mixtral shaped", "makes layers 1 dense", "--moe-shared-expert-intermediate-size",
                         "--moe-router-pre-softmax"});
  const train::Arguments dense = arguments_from_hf(llama_config("llama", false, 2));
  testing::expect_error([&] { hf_config_from_model(HfFamily::Mixtral, dense, DType::F32); }, {"no MoE layers"});
}

TEST(HfQwen3, ConfigMapsToQkLayernormAndMoeArgumentsAndBack) {
  train::Arguments a = arguments_from_hf(qwen3_config(2));
  EXPECT_TRUE(a.model.qk_layernorm);
  EXPECT_EQ(a.model.kv_channels, 12);
  EXPECT_EQ(a.moe.num_experts, 0);

  json c = qwen3_moe_config(2);
  a = arguments_from_hf(c);
  EXPECT_TRUE(a.model.qk_layernorm);
  EXPECT_EQ(a.moe.num_experts, 4);
  EXPECT_EQ(a.moe.moe_router_topk, 2);
  EXPECT_EQ(a.moe.moe_ffn_hidden_size, 16);
  EXPECT_EQ(a.model.ffn_hidden_size, 48);  // the dense layer's
  EXPECT_TRUE(a.moe.moe_router_pre_softmax) << "norm_topk_prob false: the top-k of the softmax, not renormalised";
  EXPECT_EQ(a.moe.moe_layer_freq, "[1,0]");
  EXPECT_EQ(a.moe.moe_aux_loss_coeff, std::vector<double>{0.01});
  const json back = hf_config_from_model(HfFamily::Qwen3Moe, a, DType::BF16);
  EXPECT_EQ(back["architectures"], json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(back["mlp_only_layers"], json::array({1}));
  EXPECT_EQ(back["norm_topk_prob"], false);
  EXPECT_EQ(back["head_dim"], 12);

  // Every second layer sparse, 1-based (layers 1, 3 of 4), renormalised; transformers 4's num_experts.
  c["num_hidden_layers"] = 4;
  c["decoder_sparse_step"] = 2;
  c["mlp_only_layers"] = json::array({3});
  c["norm_topk_prob"] = true;
  c.erase("num_local_experts");
  a = arguments_from_hf(c);
  EXPECT_EQ(a.moe.moe_layer_freq, "[0,1,0,0]");
  EXPECT_FALSE(a.moe.moe_router_pre_softmax);
  EXPECT_EQ(a.moe.num_experts, 4);
  EXPECT_EQ(hf_config_from_model(HfFamily::Qwen3Moe, a, DType::F32)["mlp_only_layers"], json::array({0, 2, 3}));
  c["mlp_only_layers"] = json::array({7});
  testing::expect_error([&] { arguments_from_hf(c); }, {"mlp_only_layers", "7", "not a layer of 0..3"});
}

TEST(HfQwen3, QkNormsMapToTheAttentionsLayernormsAndOnlyToQwen3) {
  const json c = qwen3_config(2);
  const train::Arguments a = arguments_from_hf(c);
  const TensorMap hf = hf_tensors(c, DType::F32);
  const TensorMap ours = hf_to_megatron(HfFamily::Qwen3, a, 128, hf);
  for (const char* which : {"q", "k"}) {
    const HostTensor& got = ours.at(str_cat("decoder.layers.1.self_attention.", which, "_layernorm.weight"));
    EXPECT_EQ(got.shape, (std::vector<int64_t>{12}));
    EXPECT_TRUE(got.bytes == hf.at(str_cat("model.layers.1.self_attn.", which, "_norm.weight")).bytes) << which;
  }
  // A model with q/k norms has no Llama, Mixtral or Qwen2 form; one without them no Qwen3 form.
  testing::expect_error([&] { hf_config_from_model(HfFamily::Llama, a, DType::F32); },
                        {"--qk-layernorm", "export it as qwen3 or qwen3_moe"});
  const train::Arguments plain = arguments_from_hf(llama_config("llama", false, 2));
  testing::expect_error([&] { hf_config_from_model(HfFamily::Qwen3, plain, DType::F32); },
                        {"no --qk-layernorm", "qwen3 needs"});
  testing::expect_error([&] { megatron_to_hf(HfFamily::Llama, a, ours); }, {"llama has no q/k norms"});
  // Qwen3-MoE cannot hold a shared expert or dropped tokens.
  train::Arguments moe = arguments_from_hf(qwen3_moe_config(2));
  moe.moe.moe_shared_expert_intermediate_size = 32;
  testing::expect_error([&] { hf_config_from_model(HfFamily::Qwen3Moe, moe, DType::F32); },
                        {"not qwen3_moe shaped", "--moe-shared-expert-intermediate-size"});
}

TEST(HfQwen2Moe, GatedSharedExpertMapsToMegatronsAndBack) {
  const json c = qwen2_moe_config(2);
  const train::Arguments a = arguments_from_hf(c);
  EXPECT_FALSE(a.model.qk_layernorm);
  EXPECT_TRUE(a.model.add_qkv_bias);
  EXPECT_EQ(a.moe.moe_shared_expert_intermediate_size, 24);
  EXPECT_TRUE(a.moe.moe_shared_expert_gate);
  EXPECT_TRUE(a.moe.moe_router_pre_softmax);
  EXPECT_EQ(a.moe.moe_layer_freq, "[1,0]");
  const TensorMap hf = hf_tensors(c, DType::F32);
  const TensorMap ours = hf_to_megatron(HfFamily::Qwen2Moe, a, 128, hf);
  const std::string s = "decoder.layers.0.mlp.shared_experts.";
  EXPECT_TRUE(ours.at(s + "gate_weight").bytes == hf.at("model.layers.0.mlp.shared_expert_gate.weight").bytes);
  EXPECT_EQ(ours.at(s + "linear_fc1.weight").shape, (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(ours.count("decoder.layers.1.mlp.shared_experts.gate_weight"), 0u) << "layer 1 is dense";
  const json back = hf_config_from_model(HfFamily::Qwen2Moe, a, DType::BF16);
  EXPECT_EQ(back["shared_expert_intermediate_size"], 24);
  EXPECT_EQ(back["qkv_bias"], true);
  // Qwen2-MoE always gates a shared expert; Qwen3-MoE and Mixtral have none.
  train::Arguments ungated = a;
  ungated.moe.moe_shared_expert_gate = false;
  testing::expect_error([&] { hf_config_from_model(HfFamily::Qwen2Moe, ungated, DType::F32); },
                        {"not qwen2_moe shaped", "--moe-shared-expert-gate"});
  testing::expect_error([&] { hf_config_from_model(HfFamily::Qwen3Moe, a, DType::F32); }, {"no --qk-layernorm"});
  testing::expect_error([&] { hf_config_from_model(HfFamily::Mixtral, a, DType::F32); },
                        {"not Mixtral shaped", "--moe-shared-expert-intermediate-size"});
}

}  // namespace
}  // namespace megatron::checkpoint
