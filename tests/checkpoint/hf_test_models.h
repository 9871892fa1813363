// Tiny Hugging Face models made in the tests (no Python): configs of each family and random HF-named tensors
// as transformers' save_pretrained would hold them (Llama GQA, Mistral, Qwen2 with q/k/v biases, GPT-2 with
// Conv1D weights, Mixtral with 4 experts, Qwen3 with q/k norms and a head_dim of its own, Qwen3-MoE with a dense
// layer, Qwen2-MoE with a gated shared expert).
#pragma once

#include <nlohmann/json.hpp>

#include "harness.h"
#include "megatron/checkpoint/hf_checkpoint.h"

namespace megatron::checkpoint::testmodels {

using json = nlohmann::json;

inline HostTensor random_tensor(std::vector<int64_t> shape, DType dtype, uint64_t seed) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(size_t(t.numel()) * dtype_size(dtype));
  Tensor view = Tensor::from_blob(t.bytes.data(), Shape(t.shape), dtype, Device::cpu());
  testing::fill_random(view, seed, -1.0, 1.0);
  return t;
}

inline json llama_config(const std::string& type, bool tied, int kv_heads) {
  return {{"model_type", type},         {"hidden_size", 32},        {"intermediate_size", 48},
          {"num_attention_heads", 4},   {"num_key_value_heads", kv_heads}, {"num_hidden_layers", 2},
          {"rms_norm_eps", 1e-5},       {"rope_theta", 50000.0},    {"vocab_size", 100},
          {"max_position_embeddings", 64}, {"tie_word_embeddings", tied}, {"hidden_act", "silu"},
          {"bos_token_id", 1},          {"eos_token_id", 2}};
}

// Mixtral: 4 experts of width 48 (intermediate_size), top 2.
inline json mixtral_config(int kv_heads) {
  json c = llama_config("mixtral", false, kv_heads);
  c["num_local_experts"] = 4;
  c["num_experts_per_tok"] = 2;
  c["router_aux_loss_coef"] = 0.02;
  c["router_jitter_noise"] = 0.0;
  c["output_router_logits"] = false;
  c["sliding_window"] = nullptr;
  return c;
}

// Qwen3: q_norm/k_norm, head_dim 12 (not hidden / heads = 8).
inline json qwen3_config(int kv_heads) {
  json c = llama_config("qwen3", false, kv_heads);
  c["head_dim"] = 12;
  c["attention_bias"] = false;
  c["use_sliding_window"] = false;
  return c;
}

// Qwen3-MoE: 4 experts of width 16 (moe_intermediate_size), top 2, not renormalised; layer 1 dense (width 48).
inline json qwen3_moe_config(int kv_heads) {
  json c = qwen3_config(kv_heads);
  c["model_type"] = "qwen3_moe";
  c["num_local_experts"] = 4;
  c["num_experts"] = 4;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 16;
  c["norm_topk_prob"] = false;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array({1});
  c["router_aux_loss_coef"] = 0.01;
  return c;
}

// Qwen2-MoE: Qwen3-MoE's experts and dense layer without the q/k norms, q/k/v biases, a gated shared expert of 24.
inline json qwen2_moe_config(int kv_heads) {
  json c = qwen3_moe_config(kv_heads);
  c["model_type"] = "qwen2_moe";
  c.erase("head_dim");
  c.erase("attention_bias");
  c["qkv_bias"] = true;
  c["shared_expert_intermediate_size"] = 24;
  return c;
}

inline json gpt2_config() {
  return {{"model_type", "gpt2"}, {"n_embd", 32},      {"n_layer", 2},           {"n_head", 4},
          {"n_positions", 40},    {"vocab_size", 90},  {"layer_norm_epsilon", 1e-5}, {"activation_function", "gelu_new"},
          {"n_inner", nullptr},   {"bos_token_id", 89}, {"eos_token_id", 89}};
}

// HF-named tensors for a config (what transformers' save_pretrained would hold).
inline TensorMap hf_tensors(const json& c, DType dtype) {
  TensorMap t;
  uint64_t seed = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { t[name] = random_tensor(shape, dtype, seed++); };
  if (c["model_type"] == "gpt2") {
    const int64_t h = c["n_embd"], V = c["vocab_size"], P = c["n_positions"], F = 4 * h;
    add("transformer.wte.weight", {V, h});
    add("transformer.wpe.weight", {P, h});
    for (int i = 0; i < int(c["n_layer"]); ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      add(p + "ln_1.weight", {h});
      add(p + "ln_1.bias", {h});
      add(p + "attn.c_attn.weight", {h, 3 * h});
      add(p + "attn.c_attn.bias", {3 * h});
      add(p + "attn.c_proj.weight", {h, h});
      add(p + "attn.c_proj.bias", {h});
      add(p + "ln_2.weight", {h});
      add(p + "ln_2.bias", {h});
      add(p + "mlp.c_fc.weight", {h, F});
      add(p + "mlp.c_fc.bias", {F});
      add(p + "mlp.c_proj.weight", {F, h});
      add(p + "mlp.c_proj.bias", {h});
    }
    add("transformer.ln_f.weight", {h});
    add("transformer.ln_f.bias", {h});
    return t;
  }
  const int64_t h = c["hidden_size"], n = c["num_attention_heads"], g = c["num_key_value_heads"];
  const int64_t d = c.contains("head_dim") ? c["head_dim"].get<int64_t>() : h / n;
  const int64_t F = c["intermediate_size"], V = c["vocab_size"];
  const bool qkv_bias = c["model_type"] == "qwen2" || c["model_type"] == "qwen2_moe";
  const bool qk_norm = c["model_type"] == "qwen3" || c["model_type"] == "qwen3_moe";
  add("model.embed_tokens.weight", {V, h});
  for (int i = 0; i < int(c["num_hidden_layers"]); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {n * d, h});
    add(p + "self_attn.k_proj.weight", {g * d, h});
    add(p + "self_attn.v_proj.weight", {g * d, h});
    add(p + "self_attn.o_proj.weight", {h, n * d});
    if (qkv_bias) {
      add(p + "self_attn.q_proj.bias", {n * d});
      add(p + "self_attn.k_proj.bias", {g * d});
      add(p + "self_attn.v_proj.bias", {g * d});
    }
    if (qk_norm) {
      add(p + "self_attn.q_norm.weight", {d});
      add(p + "self_attn.k_norm.weight", {d});
    }
    const json dense = c.value("mlp_only_layers", json::array());
    const bool sparse = c["model_type"] == "qwen3_moe" || c["model_type"] == "qwen2_moe";
    if (sparse && std::find(dense.begin(), dense.end(), i) == dense.end()) {
      const int64_t E = c["num_local_experts"], Fe = c["moe_intermediate_size"];
      if (c.contains("shared_expert_intermediate_size")) {
        const int64_t Fs = c["shared_expert_intermediate_size"];
        add(p + "mlp.shared_expert.gate_proj.weight", {Fs, h});
        add(p + "mlp.shared_expert.up_proj.weight", {Fs, h});
        add(p + "mlp.shared_expert.down_proj.weight", {h, Fs});
        add(p + "mlp.shared_expert_gate.weight", {1, h});
      }
      add(p + "mlp.gate.weight", {E, h});
      for (int e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {Fe, h});
        add(x + "up_proj.weight", {Fe, h});
        add(x + "down_proj.weight", {h, Fe});
      }
      continue;
    }
    if (c["model_type"] == "mixtral") {
      const std::string moe = p + "block_sparse_moe.";
      add(moe + "gate.weight", {c["num_local_experts"], h});
      for (int e = 0; e < int(c["num_local_experts"]); ++e) {
        const std::string x = moe + "experts." + std::to_string(e) + ".";
        add(x + "w1.weight", {F, h});
        add(x + "w2.weight", {h, F});
        add(x + "w3.weight", {F, h});
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {F, h});
    add(p + "mlp.up_proj.weight", {F, h});
    add(p + "mlp.down_proj.weight", {h, F});
  }
  add("model.norm.weight", {h});
  if (!c["tie_word_embeddings"].get<bool>()) add("lm_head.weight", {V, h});
  return t;
}

}  // namespace megatron::checkpoint::testmodels
