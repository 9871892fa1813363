// config.json <-> model and MoE arguments for the Hugging Face families (hf_convert.h states the mapping).
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "megatron/checkpoint/hf_convert.h"
#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/train/moe_arguments.h"

namespace megatron::checkpoint {
using json = nlohmann::json;

namespace {
std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

// config.json's `key` as a T (int, double, bool or string), `fallback` when absent or null; a value of another
// type (or an integer outside int) is an error naming the key and the value.
template <class T>
T get_or(const json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  bool ok = false;
  if constexpr (std::is_same_v<T, int>)
    ok = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
         : v.is_number_integer() ? v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                       v.get<int64_t>() <= std::numeric_limits<int>::max()
                                 : false;
  else if constexpr (std::is_same_v<T, double>)
    ok = v.is_number();
  else if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else
    ok = v.is_string();
  const char* type = std::is_same_v<T, int> ? "an integer" : std::is_same_v<T, double> ? "a number"
                     : std::is_same_v<T, bool> ? "true or false" : "a string";
  MEGATRON_CHECK(ok, "convert: config.json: \"", key, "\" must be ", type, ", got ", quoted_bytes(v.dump()));
  return v.get<T>();
}

// A required integer of config.json.
int required_int(const json& c, const char* key) {
  MEGATRON_CHECK(c.contains(key) && !c[key].is_null(), "convert: config.json has no \"", key, "\"");
  return get_or<int>(c, key, 0);
}

// Every size the mapping divides by or allocates with must be positive: all violations at once.
void check_sizes(const train::Arguments& a) {
  const train::ModelArguments& m = a.model;
  std::vector<std::string> bad;
  const std::pair<const char*, int> sizes[] = {
      {"the layer count", m.num_layers},       {"the hidden size", m.hidden_size},
      {"the attention heads", m.num_attention_heads}, {"the key/value heads", m.num_query_groups},
      {"the head dimension", m.kv_channels},   {"the MLP width", m.ffn_hidden_size},
      {"the vocabulary", m.vocab_size},        {"the positions", m.max_position_embeddings}};
  for (const auto& [what, value] : sizes)
    if (value <= 0) bad.push_back(str_cat(what, " (", value, ")"));
  MEGATRON_CHECK(bad.empty(), "convert: config.json gives sizes that must be positive: ", joined(bad));
}


void gpt2_arguments(const json& c, train::ModelArguments& m, std::vector<std::string>& unsupported) {
  m.num_layers = required_int(c, "n_layer");
  m.hidden_size = required_int(c, "n_embd");
  m.num_attention_heads = required_int(c, "n_head");
  m.ffn_hidden_size = get_or<int>(c, "n_inner", 4 * m.hidden_size);
  m.max_position_embeddings = required_int(c, "n_positions");
  m.seq_length = m.max_position_embeddings;
  m.position_embedding_type = "learned_absolute";
  m.normalization = "LayerNorm";
  m.norm_epsilon = get_or<double>(c, "layer_norm_epsilon", 1e-5);
  const std::string act = get_or<std::string>(c, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    unsupported.push_back("activation_function '" + act + "' (only the tanh GELU, gelu_new)");
  if (get_or<bool>(c, "scale_attn_by_inverse_layer_idx", false)) unsupported.push_back("scale_attn_by_inverse_layer_idx");
  if (!get_or<bool>(c, "scale_attn_weights", true)) unsupported.push_back("scale_attn_weights false");
  if (!get_or<bool>(c, "tie_word_embeddings", true)) unsupported.push_back("untied GPT-2 embeddings");
}

// Llama, Mistral, Qwen2, Qwen3, Mixtral and Qwen3-MoE: the decoder without its MLP's MoE part. Mistral's and Mixtral's
// sliding_window is not read (full causal attention: exact for sequences up to the window).
void llama_style_arguments(HfFamily f, const json& c, train::ModelArguments& m, std::vector<std::string>& unsupported) {
  m.num_layers = required_int(c, "num_hidden_layers");
  m.hidden_size = required_int(c, "hidden_size");
  m.num_attention_heads = required_int(c, "num_attention_heads");
  m.num_query_groups = get_or<int>(c, "num_key_value_heads", m.num_attention_heads);
  m.group_query_attention = m.num_query_groups != m.num_attention_heads;
  m.kv_channels = get_or<int>(c, "head_dim", m.num_attention_heads > 0 ? m.hidden_size / m.num_attention_heads : 0);
  m.ffn_hidden_size = required_int(c, "intermediate_size");
  m.max_position_embeddings = get_or<int>(c, "max_position_embeddings", 4096);
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.position_embedding_type = "rope";
  m.swiglu = true;
  m.normalization = "RMSNorm";
  m.norm_epsilon = get_or<double>(c, "rms_norm_eps", 1e-6);
  m.untie_embeddings_and_output_weights = !get_or<bool>(c, "tie_word_embeddings", false);
  // transformers 5 keeps rope_theta (and the scaling type) in rope_parameters; 4.x at the top level.
  json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"] : json::object();
  m.rotary_base = get_or<double>(rope, "rope_theta", get_or<double>(c, "rope_theta", 10000.0));
  m.rotary_percent = get_or<double>(rope, "partial_rotary_factor", get_or<double>(c, "partial_rotary_factor", 1.0));
  const json* scaling = c.contains("rope_scaling") ? &c["rope_scaling"] : nullptr;
  for (const json* r : {static_cast<const json*>(&rope), scaling}) {
    if (r == nullptr || !r->is_object()) continue;
    const std::string type = get_or<std::string>(*r, "rope_type", get_or<std::string>(*r, "type", "default"));
    if (type != "default") unsupported.push_back("RoPE scaling '" + type + "' (only plain RoPE)");
  }
  const std::string act = get_or<std::string>(c, "hidden_act", "silu");
  if (act != "silu") unsupported.push_back("hidden_act '" + act + "' (only SwiGLU with silu)");
  // Llama's attention_bias is on q, k, v and o, its mlp_bias on the MLP: every linear then has a bias here.
  // Qwen2's biases are on q, k and v only: --add-qkv-bias, so that no zero biases are made up.
  const bool attention_bias = get_or<bool>(c, "attention_bias", false), mlp_bias = get_or<bool>(c, "mlp_bias", false);
  m.disable_bias_linear = !(attention_bias || mlp_bias);
  m.add_qkv_bias = m.disable_bias_linear &&
                   (f == HfFamily::Qwen2 || (f == HfFamily::Qwen2Moe && get_or<bool>(c, "qkv_bias", true)));
  const bool qwen = f == HfFamily::Qwen2 || f == HfFamily::Qwen2Moe || f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe;
  if (qwen && get_or<bool>(c, "use_sliding_window", false))
    unsupported.push_back(str_cat(hf_family_name(f), " sliding-window attention"));
  m.qk_layernorm = f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe;  // q_norm, k_norm
}

// Mixtral's sparse MoE block on every layer (the default --moe-layer-freq 1).
void mixtral_arguments(const json& c, train::Arguments& a, std::vector<std::string>& unsupported) {
  train::MoeArguments& e = a.moe;
  e.num_experts = get_or<int>(c, "num_local_experts", 8);
  e.moe_router_topk = get_or<int>(c, "num_experts_per_tok", 2);
  e.moe_ffn_hidden_size = a.model.ffn_hidden_size;
  const double coef = get_or<double>(c, "router_aux_loss_coef", 0.0);
  if (coef > 0) e.moe_aux_loss_coeff = {coef};
  if (e.moe_router_topk == 1)
    unsupported.push_back("num_experts_per_tok 1 (Mixtral renormalises the top-1 probability to 1; a top-1 softmax "
                          "router needs --moe-router-pre-softmax here, which does not)");
  if (get_or<double>(c, "router_jitter_noise", 0.0) != 0.0)
    unsupported.push_back("router_jitter_noise " + c["router_jitter_noise"].dump() + " (no router input jitter)");
}

// Qwen2-MoE's and Qwen3-MoE's sparse blocks: on layer i (0-based) when (i + 1) % decoder_sparse_step == 0 and i
// is not in mlp_only_layers; the other layers are dense (intermediate_size).
std::vector<bool> qwen_moe_layers(const json& c, int num_layers, std::vector<std::string>& unsupported) {
  const int step = get_or<int>(c, "decoder_sparse_step", 1);
  std::vector<bool> moe(size_t(std::max(num_layers, 0)), false);
  if (step < 1) {
    unsupported.push_back(str_cat("decoder_sparse_step ", step, " (must be at least 1)"));
    return moe;
  }
  for (int i = 0; i < num_layers; ++i) moe[size_t(i)] = (i + 1) % step == 0;
  if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
    MEGATRON_CHECK(c["mlp_only_layers"].is_array(), "convert: config.json: \"mlp_only_layers\" must be a list of layer "
                   "numbers, got ", quoted_bytes(c["mlp_only_layers"].dump()));
    for (const json& l : c["mlp_only_layers"]) {
      MEGATRON_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < num_layers,
                     "convert: config.json: \"mlp_only_layers\" holds ", quoted_bytes(l.dump()), ", not a layer of 0..",
                     num_layers - 1);
      moe[size_t(l.get<int64_t>())] = false;
    }
  }
  return moe;
}

// --moe-layer-freq for a per-layer pattern: 1 when every layer is MoE, else Megatron's list form "[1,0,...]".
std::string moe_layer_freq_of(const std::vector<bool>& moe) {
  if (std::find(moe.begin(), moe.end(), false) == moe.end()) return "1";
  std::string s = "[";
  for (size_t i = 0; i < moe.size(); ++i) s += (i ? "," : "") + std::string(moe[i] ? "1" : "0");
  return s + "]";
}

// Qwen2-MoE's and Qwen3-MoE's experts, router and sparse layers; Qwen2-MoE's gated shared expert.
void qwen_moe_arguments(HfFamily f, const json& c, train::Arguments& a, std::vector<std::string>& unsupported) {
  train::MoeArguments& e = a.moe;
  e.num_experts = get_or<int>(c, "num_local_experts", get_or<int>(c, "num_experts", 0));
  e.moe_router_topk = required_int(c, "num_experts_per_tok");
  e.moe_ffn_hidden_size = required_int(c, "moe_intermediate_size");
  e.moe_router_pre_softmax = !get_or<bool>(c, "norm_topk_prob", false);  // softmax over all, top-k, as they are
  const double coef = get_or<double>(c, "router_aux_loss_coef", 0.0);
  if (coef > 0) e.moe_aux_loss_coeff = {coef};
  e.moe_layer_freq = moe_layer_freq_of(qwen_moe_layers(c, a.model.num_layers, unsupported));
  if (f == HfFamily::Qwen2Moe) {
    e.moe_shared_expert_intermediate_size = required_int(c, "shared_expert_intermediate_size");
    e.moe_shared_expert_gate = true;
  }
}

}  // namespace

HfFamily parse_hf_family(const std::string& name) {
  if (name == "llama") return HfFamily::Llama;
  if (name == "mistral") return HfFamily::Mistral;
  if (name == "qwen2") return HfFamily::Qwen2;
  if (name == "qwen3") return HfFamily::Qwen3;
  if (name == "qwen3_moe") return HfFamily::Qwen3Moe;
  if (name == "gpt2") return HfFamily::GPT2;
  if (name == "mixtral") return HfFamily::Mixtral;
  if (name == "qwen2_moe") return HfFamily::Qwen2Moe;
  MEGATRON_FAIL("convert: model type ", quoted_bytes(name),
                " is not supported (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gpt2)");
}

const char* hf_family_name(HfFamily f) {
  switch (f) {
    case HfFamily::Llama: return "llama";
    case HfFamily::Mistral: return "mistral";
    case HfFamily::Qwen2: return "qwen2";
    case HfFamily::Qwen3: return "qwen3";
    case HfFamily::GPT2: return "gpt2";
    case HfFamily::Mixtral: return "mixtral";
    case HfFamily::Qwen2Moe: return "qwen2_moe";
    case HfFamily::Qwen3Moe: return "qwen3_moe";
  }
  return "?";
}

HfFamily hf_family_of(const json& config) {
  MEGATRON_CHECK(config.is_object(), "convert: config.json must be a JSON object, it is ", config.type_name());
  MEGATRON_CHECK(config.contains("model_type"), "convert: config.json has no model_type");
  return parse_hf_family(get_or<std::string>(config, "model_type", ""));
}

train::Arguments arguments_from_hf(const json& c) {
  const HfFamily f = hf_family_of(c);
  train::Arguments a;
  train::ModelArguments& m = a.model;
  std::vector<std::string> unsupported;
  m.attention_dropout = 0;
  m.hidden_dropout = 0;
  m.init_method_std = get_or<double>(c, "initializer_range", 0.02);
  m.vocab_size = required_int(c, "vocab_size");
  m.make_vocab_size_divisible_by = 128;
  if (f == HfFamily::GPT2) gpt2_arguments(c, m, unsupported);
  else llama_style_arguments(f, c, m, unsupported);
  if (f == HfFamily::Mixtral) mixtral_arguments(c, a, unsupported);
  if (f == HfFamily::Qwen2Moe || f == HfFamily::Qwen3Moe) qwen_moe_arguments(f, c, a, unsupported);
  MEGATRON_CHECK(unsupported.empty(), "convert: this ", hf_family_name(f),
                 " configuration uses what megatron.cpp does not implement: ", joined(unsupported));
  train::resolve(a);
  check_sizes(a);
  const std::vector<std::string> moe = train::moe_violations(a);
  MEGATRON_CHECK(moe.empty(), "convert: this ", hf_family_name(f), " configuration gives invalid MoE arguments: ",
                 joined(moe));
  return a;
}

namespace {

void gpt2_config(const train::ModelArguments& m, json& c) {
  MEGATRON_CHECK(m.position_embedding_type == "learned_absolute" && m.normalization == "LayerNorm" && !m.swiglu &&
                     !m.untie_embeddings_and_output_weights && !m.disable_bias_linear &&
                     m.num_query_groups == m.num_attention_heads && m.kv_channels * m.num_attention_heads == m.hidden_size,
                 "convert: this model is not GPT-2 shaped (GPT-2 needs learned positions, LayerNorm, GELU, tied "
                 "embeddings, biases and plain multi-head attention)");
  c["model_type"] = "gpt2";
  c["architectures"] = {"GPT2LMHeadModel"};
  c["n_layer"] = m.num_layers;
  c["n_embd"] = m.hidden_size;
  c["n_head"] = m.num_attention_heads;
  c["n_inner"] = m.ffn_hidden_size;
  c["n_positions"] = m.max_position_embeddings;
  c["n_ctx"] = m.max_position_embeddings;
  c["layer_norm_epsilon"] = m.norm_epsilon;
  c["activation_function"] = "gelu_new";
  c["tie_word_embeddings"] = true;
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) c[k] = 0.0;
  if (!c.contains("bos_token_id")) c["bos_token_id"] = m.vocab_size - 1;
  if (!c.contains("eos_token_id")) c["eos_token_id"] = m.vocab_size - 1;
}

const char* architecture_name(HfFamily f) {
  switch (f) {
    case HfFamily::Llama: return "LlamaForCausalLM";
    case HfFamily::Mistral: return "MistralForCausalLM";
    case HfFamily::Qwen2: return "Qwen2ForCausalLM";
    case HfFamily::Qwen3: return "Qwen3ForCausalLM";
    case HfFamily::GPT2: return "GPT2LMHeadModel";
    case HfFamily::Mixtral: return "MixtralForCausalLM";
    case HfFamily::Qwen2Moe: return "Qwen2MoeForCausalLM";
    case HfFamily::Qwen3Moe: return "Qwen3MoeForCausalLM";
  }
  return "?";
}

void llama_style_config(HfFamily f, const train::ModelArguments& m, json& c) {
  MEGATRON_CHECK(m.position_embedding_type == "rope" && m.normalization == "RMSNorm" && m.swiglu,
                 "convert: this model is not ", hf_family_name(f), " shaped (needs RoPE, RMSNorm and SwiGLU)");
  c["model_type"] = hf_family_name(f);
  c["architectures"] = {architecture_name(f)};
  c["num_hidden_layers"] = m.num_layers;
  c["hidden_size"] = m.hidden_size;
  c["num_attention_heads"] = m.num_attention_heads;
  c["num_key_value_heads"] = m.num_query_groups;
  c["head_dim"] = m.kv_channels;
  c["intermediate_size"] = m.ffn_hidden_size;
  c["max_position_embeddings"] = m.max_position_embeddings;
  c["rms_norm_eps"] = m.norm_epsilon;
  c["hidden_act"] = "silu";
  c["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
  c["rope_theta"] = m.rotary_base;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", m.rotary_base}};
  if (m.rotary_percent != 1.0) {
    c["partial_rotary_factor"] = m.rotary_percent;
    c["rope_parameters"]["partial_rotary_factor"] = m.rotary_percent;
  }
  c.erase("rope_scaling");
  c["attention_dropout"] = 0.0;
  const bool qk = f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe;
  MEGATRON_CHECK(m.qk_layernorm == qk, "convert: this model ",
                 m.qk_layernorm ? "has --qk-layernorm (per-head q/k norms), which " : "has no --qk-layernorm, which ",
                 hf_family_name(f), qk ? " needs" : " has no place for",
                 m.qk_layernorm ? ": export it as qwen3 or qwen3_moe (--hf-model-type)" : "");
  if (f == HfFamily::Llama || f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe)  // q/k/v biases need o_proj's (zero)
    c["attention_bias"] = !m.disable_bias_linear || m.add_qkv_bias;
  if (f == HfFamily::Llama) c["mlp_bias"] = !m.disable_bias_linear;
  const bool windowed = f == HfFamily::Mistral || f == HfFamily::Mixtral;
  if (windowed && !c.contains("sliding_window")) c["sliding_window"] = nullptr;
  if (f == HfFamily::Qwen2 || f == HfFamily::Qwen2Moe || qk) c["use_sliding_window"] = false;
  if (f == HfFamily::Qwen2Moe) c["qkv_bias"] = m.add_qkv_bias || !m.disable_bias_linear;
}

// What keeps a model with experts from being a Mixtral: each option that changes the forward away from
// Mixtral's block (softmax over all experts, top-k, renormalised; every layer; no shared expert; dropless).
std::vector<std::string> mixtral_violations(const train::Arguments& a) {
  const train::MoeArguments& e = a.moe;
  std::vector<std::string> v;
  if (e.num_experts <= 0) return {"no MoE layers (--num-experts)"};
  const std::vector<bool> moe_layers = train::parse_moe_layer_freq(e.moe_layer_freq, a.model.num_layers);
  std::string dense;
  for (size_t i = 0; i < moe_layers.size(); ++i)
    if (!moe_layers[i]) dense += (dense.empty() ? "" : ", ") + std::to_string(i);
  if (!dense.empty()) v.push_back("--moe-layer-freq " + e.moe_layer_freq + " makes layers " + dense + " dense");
  if (e.moe_shared_expert_intermediate_size > 0) v.push_back("--moe-shared-expert-intermediate-size (shared experts)");
  if (e.moe_router_score_function != "softmax")
    v.push_back("--moe-router-score-function " + e.moe_router_score_function);
  if (e.moe_router_pre_softmax) v.push_back("--moe-router-pre-softmax (no renormalisation over the top k)");
  if (e.moe_router_num_groups > 0) v.push_back("--moe-router-num-groups (device-limited routing)");
  if (e.moe_router_topk_scaling_factor != 0 && e.moe_router_topk_scaling_factor != 1)
    v.push_back(str_cat("--moe-router-topk-scaling-factor ", e.moe_router_topk_scaling_factor));
  if (e.moe_router_enable_expert_bias) v.push_back("--moe-router-enable-expert-bias (a selection bias)");
  if (e.moe_expert_capacity_factor > 0) v.push_back("--moe-expert-capacity-factor (dropped tokens)");
  return v;
}

// What keeps a model with experts from being a Qwen3-MoE (f Qwen3Moe) or Qwen2-MoE: Mixtral's rules, except that
// layers may be dense and the router may skip the renormalisation (norm_topk_prob false); Qwen2-MoE has a shared
// expert on every MoE layer, always gated.
std::vector<std::string> qwen_moe_violations(HfFamily f, const train::Arguments& a) {
  std::vector<std::string> v;
  const bool qwen2 = f == HfFamily::Qwen2Moe;
  for (const std::string& s : mixtral_violations(a))
    if (!s.starts_with("--moe-layer-freq") && !s.starts_with("--moe-router-pre-softmax") &&
        !(qwen2 && s.starts_with("--moe-shared-expert-intermediate-size")))
      v.push_back(s);
  if (qwen2 && (a.moe.moe_shared_expert_intermediate_size <= 0 || !a.moe.moe_shared_expert_gate))
    v.push_back("no gated shared expert (--moe-shared-expert-intermediate-size with --moe-shared-expert-gate)");
  return v;
}

void qwen_moe_config(HfFamily f, const train::Arguments& a, json& c) {
  const std::vector<std::string> v = qwen_moe_violations(f, a);
  MEGATRON_CHECK(v.empty(), "convert: this model is not ", hf_family_name(f), " shaped (it routes by a softmax over "
                 "all experts, top-k, with ", f == HfFamily::Qwen2Moe ? "a gated shared expert" : "no shared expert",
                 " and no dropped tokens): ", joined(v));
  const train::MoeArguments& e = a.moe;
  const std::vector<bool> moe = train::parse_moe_layer_freq(e.moe_layer_freq, a.model.num_layers);
  c["num_local_experts"] = e.num_experts;
  c["num_experts"] = e.num_experts;  // transformers 4's name
  c["num_experts_per_tok"] = e.moe_router_topk;
  c["moe_intermediate_size"] = e.moe_ffn_hidden_size > 0 ? e.moe_ffn_hidden_size : a.model.ffn_hidden_size;
  c["norm_topk_prob"] = !e.moe_router_pre_softmax;
  c["decoder_sparse_step"] = 1;
  json dense = json::array();
  for (size_t i = 0; i < moe.size(); ++i)
    if (!moe[i]) dense.push_back(int(i));
  c["mlp_only_layers"] = dense;
  const auto balancing = train::moe_load_balancing(e);
  c["router_aux_loss_coef"] =
      balancing.size() == 1 && balancing[0].first == "aux_loss" ? balancing[0].second : 0.0;
  if (f == HfFamily::Qwen2Moe) c["shared_expert_intermediate_size"] = e.moe_shared_expert_intermediate_size;
}

void mixtral_config(const train::Arguments& a, json& c) {
  const std::vector<std::string> v = mixtral_violations(a);
  MEGATRON_CHECK(v.empty(), "convert: this model is not Mixtral shaped (Mixtral routes every layer's tokens by a "
                 "softmax over all experts, top-k, renormalised, with no shared expert and no dropped tokens): ",
                 joined(v));
  const train::MoeArguments& e = a.moe;
  c["num_local_experts"] = e.num_experts;
  c["num_experts_per_tok"] = e.moe_router_topk;
  c["intermediate_size"] = e.moe_ffn_hidden_size > 0 ? e.moe_ffn_hidden_size : a.model.ffn_hidden_size;
  const auto balancing = train::moe_load_balancing(e);
  if (balancing.size() == 1 && balancing[0].first == "aux_loss" && balancing[0].second > 0)
    c["router_aux_loss_coef"] = balancing[0].second;
  c["router_jitter_noise"] = 0.0;
}

}  // namespace

json hf_config_from_model(HfFamily f, const train::Arguments& a, DType dtype, const json& base) {
  const train::ModelArguments& m = a.model;
  json c = base.is_object() ? base : json::object();
  if (f != HfFamily::Mixtral && f != HfFamily::Qwen2Moe && f != HfFamily::Qwen3Moe)
    MEGATRON_CHECK(a.moe.num_experts <= 0, "convert: this model has MoE layers (--num-experts ", a.moe.num_experts,
                   ") and ", hf_family_name(f), " has none: export it as mixtral, qwen2_moe or qwen3_moe "
                   "(--hf-model-type)");
  c["vocab_size"] = m.vocab_size;
  c["initializer_range"] = m.init_method_std;
  c["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  if (c.contains("dtype")) c["dtype"] = c["torch_dtype"];  // transformers 5's name for it
  if (f == HfFamily::GPT2) {
    gpt2_config(m, c);
    return c;
  }
  llama_style_config(f, m, c);
  if (f == HfFamily::Mixtral) mixtral_config(a, c);
  if (f == HfFamily::Qwen2Moe || f == HfFamily::Qwen3Moe) qwen_moe_config(f, a, c);
  return c;
}

}  // namespace megatron::checkpoint
