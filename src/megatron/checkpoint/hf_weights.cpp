// Hugging Face <-> megatron.cpp weight renaming and reshaping (hf_convert.h states the mapping).
#include <algorithm>

#include "megatron/checkpoint/hf_host_tensors.h"
#include "megatron/core/error.h"
#include "megatron/train/moe_arguments.h"

namespace megatron::checkpoint {
using json = nlohmann::json;
using namespace hf;

namespace {

// q [n*d, ...], k [g*d, ...], v [g*d, ...] -> fused per query group (nn/attention.h).
HostTensor fuse_qkv(const HostTensor& q, const HostTensor& k, const HostTensor& v, int64_t n, int64_t g, int64_t d) {
  const int64_t r = n / g;
  std::vector<HostTensor> parts;
  for (int64_t j = 0; j < g; ++j) {
    parts.push_back(slice_rows(q, j * r * d, (j + 1) * r * d));
    parts.push_back(slice_rows(k, j * d, (j + 1) * d));
    parts.push_back(slice_rows(v, j * d, (j + 1) * d));
  }
  std::vector<const HostTensor*> ptrs;
  for (const HostTensor& p : parts) ptrs.push_back(&p);
  return concat_rows(ptrs);
}

// The inverse of fuse_qkv.
void split_qkv(const HostTensor& qkv, int64_t n, int64_t g, int64_t d, HostTensor& q, HostTensor& k, HostTensor& v) {
  const int64_t r = n / g;
  std::vector<HostTensor> qs, ks, vs;
  for (int64_t j = 0; j < g; ++j) {
    const int64_t base = j * (r + 2) * d;
    qs.push_back(slice_rows(qkv, base, base + r * d));
    ks.push_back(slice_rows(qkv, base + r * d, base + (r + 1) * d));
    vs.push_back(slice_rows(qkv, base + (r + 1) * d, base + (r + 2) * d));
  }
  auto cat = [](const std::vector<HostTensor>& v) {
    std::vector<const HostTensor*> p;
    for (const HostTensor& t : v) p.push_back(&t);
    return concat_rows(p);
  };
  q = cat(qs);
  k = cat(ks);
  v = cat(vs);
}

// The configuration's sizes the mappings use: hidden, heads, query groups, head dim, FFN, vocabulary; with
// experts (Mixtral: every layer; Qwen3-MoE: the layers --moe-layer-freq names), their count and width.
struct ModelDims {
  int64_t h, n, g, d, F, V;
  bool bias;      // linear layers have biases
  bool qkv_bias;  // linear_qkv has one (every linear's, or --add-qkv-bias)
  bool qk_norm;   // --qk-layernorm: q_layernorm and k_layernorm (HF's q_norm, k_norm)
  int64_t shared_F;  // the shared experts' width (0: none)
  std::vector<bool> moe_layers;  // per layer: its MLP is an MoE block of `experts`
  ExpertDims experts;
  bool any_moe() const { return std::find(moe_layers.begin(), moe_layers.end(), true) != moe_layers.end(); }
  bool all_moe() const { return std::find(moe_layers.begin(), moe_layers.end(), false) == moe_layers.end(); }
};

ModelDims model_dims(const train::Arguments& a) {
  const train::ModelArguments& m = a.model;
  const train::MoeArguments& e = a.moe;
  return {m.hidden_size,
          m.num_attention_heads,
          m.num_query_groups,
          m.kv_channels,
          m.ffn_hidden_size,
          m.vocab_size,
          !m.disable_bias_linear,
          !m.disable_bias_linear || m.add_qkv_bias,
          m.qk_layernorm,
          e.num_experts > 0 ? e.moe_shared_expert_intermediate_size : 0,
          e.num_experts > 0 ? train::parse_moe_layer_freq(e.moe_layer_freq, m.num_layers)
                            : std::vector<bool>(size_t(std::max(m.num_layers, 0)), false),
          {e.num_experts, e.moe_ffn_hidden_size > 0 ? e.moe_ffn_hidden_size : m.ffn_hidden_size, m.hidden_size}};
}

ExpertFamily expert_family(HfFamily f) {
  return f == HfFamily::Mixtral ? ExpertFamily::Mixtral : ExpertFamily::QwenMoe;
}

// Qwen2-MoE's shared expert of layer i (mlp.shared_expert.gate_proj, up_proj [Fs, h], down_proj [h, Fs]) and its
// sigmoid gate (mlp.shared_expert_gate.weight [1, h]) <-> our mlp.shared_experts.linear_fc1 = [gate; up],
// linear_fc2 and gate_weight (--moe-shared-expert-gate).
void shared_expert_from_hf(Source& hf, TensorMap& out, int i, int64_t Fs, int64_t h) {
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  const std::string o = "decoder.layers." + std::to_string(i) + ".mlp.shared_experts.";
  out[o + "linear_fc1.weight"] = concat_rows(
      {&hf.take(p + "shared_expert.gate_proj.weight", {Fs, h}), &hf.take(p + "shared_expert.up_proj.weight", {Fs, h})});
  out[o + "linear_fc2.weight"] = hf.take(p + "shared_expert.down_proj.weight", {h, Fs});
  out[o + "gate_weight"] = hf.take(p + "shared_expert_gate.weight", {1, h});
}
void shared_expert_to_hf(Source& ours, TensorMap& out, int i, int64_t Fs, int64_t h) {
  const std::string p = "decoder.layers." + std::to_string(i) + ".mlp.shared_experts.";
  const std::string o = "model.layers." + std::to_string(i) + ".mlp.";
  const HostTensor& fc1 = ours.take(p + "linear_fc1.weight", {2 * Fs, h});
  out[o + "shared_expert.gate_proj.weight"] = slice_rows(fc1, 0, Fs);
  out[o + "shared_expert.up_proj.weight"] = slice_rows(fc1, Fs, 2 * Fs);
  out[o + "shared_expert.down_proj.weight"] = ours.take(p + "linear_fc2.weight", {h, Fs});
  out[o + "shared_expert_gate.weight"] = ours.take(p + "gate_weight", {1, h});
}

// GPT-2 block i -> decoder layer i: Conv1D weights are stored [in, out] (transposed here); c_attn holds
// q, k and v one after the other.
void gpt2_layer_from_hf(Source& hf, TensorMap& out, int i, const ModelDims& s) {
  const int64_t h = s.h, n = s.n, d = s.d, F = s.F;
  const std::string ours = "decoder.layers." + std::to_string(i) + ".";
  const std::string p = "transformer.h." + std::to_string(i) + ".";
  out[ours + "input_layernorm.weight"] = hf.take(p + "ln_1.weight", {h});
  out[ours + "input_layernorm.bias"] = hf.take(p + "ln_1.bias", {h});
  const HostTensor qkv_t = transpose2d(hf.take(p + "attn.c_attn.weight", {h, 3 * h}));
  out[ours + "self_attention.linear_qkv.weight"] =
      fuse_qkv(slice_rows(qkv_t, 0, h), slice_rows(qkv_t, h, 2 * h), slice_rows(qkv_t, 2 * h, 3 * h), n, n, d);
  const HostTensor& qkv_b = hf.take(p + "attn.c_attn.bias", {3 * h});
  out[ours + "self_attention.linear_qkv.bias"] =
      fuse_qkv(slice_rows(qkv_b, 0, h), slice_rows(qkv_b, h, 2 * h), slice_rows(qkv_b, 2 * h, 3 * h), n, n, d);
  out[ours + "self_attention.linear_proj.weight"] = transpose2d(hf.take(p + "attn.c_proj.weight", {h, h}));
  out[ours + "self_attention.linear_proj.bias"] = hf.take(p + "attn.c_proj.bias", {h});
  out[ours + "pre_mlp_layernorm.weight"] = hf.take(p + "ln_2.weight", {h});
  out[ours + "pre_mlp_layernorm.bias"] = hf.take(p + "ln_2.bias", {h});
  out[ours + "mlp.linear_fc1.weight"] = transpose2d(hf.take(p + "mlp.c_fc.weight", {h, F}));
  out[ours + "mlp.linear_fc1.bias"] = hf.take(p + "mlp.c_fc.bias", {F});
  out[ours + "mlp.linear_fc2.weight"] = transpose2d(hf.take(p + "mlp.c_proj.weight", {F, h}));
  out[ours + "mlp.linear_fc2.bias"] = hf.take(p + "mlp.c_proj.bias", {h});
}

// Llama-style block i (Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE) -> decoder layer i: q/k/v fused per
// query group (Qwen3's q_norm/k_norm as q_layernorm/k_layernorm); the MLP's gate and up stacked into fc1, or the
// family's MoE block (s.moe_layers). With linear biases (never with experts), those the checkpoint lacks are
// zeros of dtype `dt`.
void llama_layer_from_hf(HfFamily f, Source& hf, TensorMap& out, int i, const ModelDims& s, DType dt) {
  const int64_t h = s.h, n = s.n, g = s.g, d = s.d, F = s.F;
  auto zeros = [&](int64_t rows_) { return make(dt, {rows_}); };
  const std::string ours = "decoder.layers." + std::to_string(i) + ".";
  const std::string p = "model.layers." + std::to_string(i) + ".";
  out[ours + "input_layernorm.weight"] = hf.take(p + "input_layernorm.weight", {h});
  out[ours + "pre_mlp_layernorm.weight"] = hf.take(p + "post_attention_layernorm.weight", {h});
  out[ours + "self_attention.linear_qkv.weight"] =
      fuse_qkv(hf.take(p + "self_attn.q_proj.weight", {n * d, h}), hf.take(p + "self_attn.k_proj.weight", {g * d, h}),
               hf.take(p + "self_attn.v_proj.weight", {g * d, h}), n, g, d);
  out[ours + "self_attention.linear_proj.weight"] = hf.take(p + "self_attn.o_proj.weight", {h, n * d});
  if (s.qk_norm) {
    out[ours + "self_attention.q_layernorm.weight"] = hf.take(p + "self_attn.q_norm.weight", {d});
    out[ours + "self_attention.k_layernorm.weight"] = hf.take(p + "self_attn.k_norm.weight", {d});
  }
  if (s.moe_layers[size_t(i)]) {
    moe_block_from_hf(expert_family(f), hf, out, i, s.experts);
    if (s.shared_F > 0) shared_expert_from_hf(hf, out, i, s.shared_F, h);
  } else {
    out[ours + "mlp.linear_fc1.weight"] =
        concat_rows({&hf.take(p + "mlp.gate_proj.weight", {F, h}), &hf.take(p + "mlp.up_proj.weight", {F, h})});
    out[ours + "mlp.linear_fc2.weight"] = hf.take(p + "mlp.down_proj.weight", {h, F});
  }
  if (s.bias) {
    // Biases HF lacks are zero (Qwen2 has only q/k/v biases).
    auto opt = [&](const std::string& name, int64_t size) {
      return hf.has(name) ? hf.take(name, {size}) : zeros(size);
    };
    out[ours + "self_attention.linear_qkv.bias"] = fuse_qkv(opt(p + "self_attn.q_proj.bias", n * d),
                                                            opt(p + "self_attn.k_proj.bias", g * d),
                                                            opt(p + "self_attn.v_proj.bias", g * d), n, g, d);
    out[ours + "self_attention.linear_proj.bias"] = opt(p + "self_attn.o_proj.bias", h);
    const HostTensor gate = opt(p + "mlp.gate_proj.bias", F), up = opt(p + "mlp.up_proj.bias", F);
    out[ours + "mlp.linear_fc1.bias"] = concat_rows({&gate, &up});
    out[ours + "mlp.linear_fc2.bias"] = opt(p + "mlp.down_proj.bias", h);
  } else if (s.qkv_bias) {  // --add-qkv-bias (Qwen2): q, k and v only
    out[ours + "self_attention.linear_qkv.bias"] = fuse_qkv(hf.take(p + "self_attn.q_proj.bias", {n * d}),
                                                            hf.take(p + "self_attn.k_proj.bias", {g * d}),
                                                            hf.take(p + "self_attn.v_proj.bias", {g * d}), n, g, d);
  }
}

// Drops a megatron.cpp tensor the Hugging Face family has no place for, with a warning unless it is zero.
struct DropTensor {
  HfFamily f;
  std::vector<std::string>* warnings;  // may be null
  void operator()(const std::string& name, const HostTensor& t) const {
    if (!all_zero(t) && warnings)
      warnings->push_back(str_cat("'", name, "' is not zero but ", hf_family_name(f), " has no such tensor: dropped"));
  }
};

// Decoder layer i -> GPT-2 block i (the inverse of gpt2_layer_from_hf); q, k and v are layer i's
// linear_qkv.weight split.
void gpt2_layer_to_hf(Source& ours, TensorMap& out, int i, const ModelDims& s, const HostTensor& q,
                      const HostTensor& k, const HostTensor& v) {
  const int64_t h = s.h, n = s.n, g = s.g, d = s.d, F = s.F;
  const std::string p = "decoder.layers." + std::to_string(i) + ".";
  const std::string o = "transformer.h." + std::to_string(i) + ".";
  out[o + "ln_1.weight"] = ours.take(p + "input_layernorm.weight", {h});
  out[o + "ln_1.bias"] = ours.take(p + "input_layernorm.bias", {h});
  out[o + "attn.c_attn.weight"] = transpose2d(concat_rows({&q, &k, &v}));
  HostTensor qb, kb, vb;
  split_qkv(ours.take(p + "self_attention.linear_qkv.bias", {3 * h}), n, g, d, qb, kb, vb);
  out[o + "attn.c_attn.bias"] = concat_rows({&qb, &kb, &vb});
  out[o + "attn.c_proj.weight"] = transpose2d(ours.take(p + "self_attention.linear_proj.weight", {h, h}));
  out[o + "attn.c_proj.bias"] = ours.take(p + "self_attention.linear_proj.bias", {h});
  out[o + "ln_2.weight"] = ours.take(p + "pre_mlp_layernorm.weight", {h});
  out[o + "ln_2.bias"] = ours.take(p + "pre_mlp_layernorm.bias", {h});
  out[o + "mlp.c_fc.weight"] = transpose2d(ours.take(p + "mlp.linear_fc1.weight", {F, h}));
  out[o + "mlp.c_fc.bias"] = ours.take(p + "mlp.linear_fc1.bias", {F});
  out[o + "mlp.c_proj.weight"] = transpose2d(ours.take(p + "mlp.linear_fc2.weight", {h, F}));
  out[o + "mlp.c_proj.bias"] = ours.take(p + "mlp.linear_fc2.bias", {h});
}

// Layer i's linear biases -> the Llama-style family's: Llama has them all (attention_bias and mlp_bias), Qwen3
// the attention's (attention_bias: q, k, v and o), Qwen2 only q/k/v's, Mistral none; the rest are dropped.
void llama_biases_to_hf(HfFamily f, Source& ours, TensorMap& out, int i, const ModelDims& s, const DropTensor& drop) {
  const int64_t h = s.h, n = s.n, g = s.g, d = s.d, F = s.F;
  const std::string p = "decoder.layers." + std::to_string(i) + ".";
  const std::string o = "model.layers." + std::to_string(i) + ".";
  HostTensor qb, kb, vb;
  split_qkv(ours.take(p + "self_attention.linear_qkv.bias", {g * (n / g + 2) * d}), n, g, d, qb, kb, vb);
  const HostTensor& proj_b = ours.take(p + "self_attention.linear_proj.bias", {h});
  const HostTensor& fc1_b = ours.take(p + "mlp.linear_fc1.bias", {2 * F});
  const HostTensor& fc2_b = ours.take(p + "mlp.linear_fc2.bias", {h});
  if (f == HfFamily::Llama) {  // attention_bias and mlp_bias
    out[o + "self_attn.q_proj.bias"] = qb;
    out[o + "self_attn.k_proj.bias"] = kb;
    out[o + "self_attn.v_proj.bias"] = vb;
    out[o + "self_attn.o_proj.bias"] = proj_b;
    out[o + "mlp.gate_proj.bias"] = slice_rows(fc1_b, 0, F);
    out[o + "mlp.up_proj.bias"] = slice_rows(fc1_b, F, 2 * F);
    out[o + "mlp.down_proj.bias"] = fc2_b;
  } else if (f == HfFamily::Qwen3) {  // attention_bias
    out[o + "self_attn.q_proj.bias"] = qb;
    out[o + "self_attn.k_proj.bias"] = kb;
    out[o + "self_attn.v_proj.bias"] = vb;
    out[o + "self_attn.o_proj.bias"] = proj_b;
    drop(p + "mlp.linear_fc1.bias", fc1_b);
    drop(p + "mlp.linear_fc2.bias", fc2_b);
  } else if (f == HfFamily::Qwen2 || f == HfFamily::Qwen2Moe) {
    out[o + "self_attn.q_proj.bias"] = qb;
    out[o + "self_attn.k_proj.bias"] = kb;
    out[o + "self_attn.v_proj.bias"] = vb;
    drop(p + "self_attention.linear_proj.bias", proj_b);
    drop(p + "mlp.linear_fc1.bias", fc1_b);
    drop(p + "mlp.linear_fc2.bias", fc2_b);
  } else {
    for (const auto* t : {&qb, &kb, &vb}) drop(p + "self_attention.linear_qkv.bias", *t);
    drop(p + "self_attention.linear_proj.bias", proj_b);
    drop(p + "mlp.linear_fc1.bias", fc1_b);
    drop(p + "mlp.linear_fc2.bias", fc2_b);
  }
}

// Layer i's q/k/v bias alone (--add-qkv-bias) -> Qwen2's q/k/v biases, or Llama's and Qwen3's attention_bias (with
// a zero o_proj bias, which their attention_bias also has); Mistral and the MoE families have none: dropped.
void llama_qkv_bias_to_hf(HfFamily f, Source& ours, TensorMap& out, int i, const ModelDims& s, const DropTensor& drop) {
  const int64_t n = s.n, g = s.g, d = s.d;
  const std::string p = "decoder.layers." + std::to_string(i) + ".";
  const std::string o = "model.layers." + std::to_string(i) + ".";
  HostTensor qb, kb, vb;
  split_qkv(ours.take(p + "self_attention.linear_qkv.bias", {g * (n / g + 2) * d}), n, g, d, qb, kb, vb);
  const bool qkv_only = f == HfFamily::Qwen2 || f == HfFamily::Qwen2Moe;
  if (!qkv_only && f != HfFamily::Llama && f != HfFamily::Qwen3) {
    for (const auto* t : {&qb, &kb, &vb}) drop(p + "self_attention.linear_qkv.bias", *t);
    return;
  }
  if (!qkv_only) out[o + "self_attn.o_proj.bias"] = make(qb.dtype, {s.h});
  out[o + "self_attn.q_proj.bias"] = qb;
  out[o + "self_attn.k_proj.bias"] = kb;
  out[o + "self_attn.v_proj.bias"] = vb;
}

// Decoder layer i -> Llama-style block i (the inverse of llama_layer_from_hf); q, k and v as above.
void llama_layer_to_hf(HfFamily f, Source& ours, TensorMap& out, int i, const ModelDims& s, const HostTensor& q,
                       const HostTensor& k, const HostTensor& v, const DropTensor& drop) {
  const int64_t h = s.h, n = s.n, d = s.d, F = s.F;
  const std::string p = "decoder.layers." + std::to_string(i) + ".";
  const std::string o = "model.layers." + std::to_string(i) + ".";
  out[o + "input_layernorm.weight"] = ours.take(p + "input_layernorm.weight", {h});
  out[o + "post_attention_layernorm.weight"] = ours.take(p + "pre_mlp_layernorm.weight", {h});
  out[o + "self_attn.q_proj.weight"] = q;
  out[o + "self_attn.k_proj.weight"] = k;
  out[o + "self_attn.v_proj.weight"] = v;
  out[o + "self_attn.o_proj.weight"] = ours.take(p + "self_attention.linear_proj.weight", {h, n * d});
  if (s.qk_norm) {
    out[o + "self_attn.q_norm.weight"] = ours.take(p + "self_attention.q_layernorm.weight", {d});
    out[o + "self_attn.k_norm.weight"] = ours.take(p + "self_attention.k_layernorm.weight", {d});
  }
  if (s.moe_layers[size_t(i)]) {
    moe_block_to_hf(expert_family(f), ours, out, i, s.experts);
    if (s.shared_F > 0) shared_expert_to_hf(ours, out, i, s.shared_F, h);
  } else {
    const HostTensor& fc1 = ours.take(p + "mlp.linear_fc1.weight", {2 * F, h});
    out[o + "mlp.gate_proj.weight"] = slice_rows(fc1, 0, F);
    out[o + "mlp.up_proj.weight"] = slice_rows(fc1, F, 2 * F);
    out[o + "mlp.down_proj.weight"] = ours.take(p + "mlp.linear_fc2.weight", {h, F});
  }
  if (s.bias) llama_biases_to_hf(f, ours, out, i, s, drop);
  else if (s.qkv_bias) llama_qkv_bias_to_hf(f, ours, out, i, s, drop);
}

// Experts belong to Mixtral (on every layer) and Qwen3-MoE, q/k norms to Qwen3 and Qwen3-MoE: anything else is a
// caller's mistake (hf_config_from_model explains it to users).
void check_layers_fit(HfFamily f, const ModelDims& s) {
  const bool sparse = f == HfFamily::Mixtral || f == HfFamily::Qwen2Moe || f == HfFamily::Qwen3Moe;
  MEGATRON_CHECK(s.any_moe() == sparse, "convert: ", hf_family_name(f),
                 s.any_moe() ? " has no experts, but this model has MoE layers" : " needs MoE layers (--num-experts)");
  MEGATRON_CHECK(f != HfFamily::Mixtral || s.all_moe(), "convert: mixtral has an MoE block on every layer");
  const bool qk = f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe;
  MEGATRON_CHECK(s.qk_norm == qk, "convert: ", hf_family_name(f),
                 qk ? " needs --qk-layernorm (q_norm, k_norm)" : " has no q/k norms, but this model has --qk-layernorm");
}

// --apply-layernorm-1p stores every norm weight centred on 0 (the norm scales by 1 + w); Hugging Face stores the
// scale itself. Adds `delta` to the norm weights among `tensors` (named ours -- every "...layernorm.weight" -- or
// Hugging Face's, is_norm_weight tells), in double, in their dtype.
bool is_norm_weight(const std::string& name) {
  return name.ends_with("layernorm.weight") || name == "model.norm.weight" || name.ends_with(".ln_1.weight") ||
         name.ends_with(".ln_2.weight") || name == "transformer.ln_f.weight" || name.ends_with(".q_norm.weight") ||
         name.ends_with(".k_norm.weight");
}

TensorMap shift_norm_weights(TensorMap tensors, double delta) {
  for (auto& [name, t] : tensors) {
    if (!is_norm_weight(name) || !is_floating(t.dtype)) continue;
    visit_dtype(t.dtype, [&]<class T>() {
      T* v = reinterpret_cast<T*>(t.bytes.data());
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = from_double<T>(to_double(v[i]) + delta);
    });
  }
  return tensors;
}

}  // namespace

TensorMap hf_to_megatron(HfFamily f, const train::Arguments& a, int64_t padded_vocab, const TensorMap& hf_in) {
  const train::ModelArguments& m = a.model;
  // GPT-2 checkpoints saved from GPT2Model lack the "transformer." prefix; accept both.
  TensorMap hf_prefixed;
  const TensorMap* hf_ptr = &hf_in;
  if (f == HfFamily::GPT2 && !hf_in.count("transformer.wte.weight") && hf_in.count("wte.weight")) {
    for (const auto& [k, v] : hf_in) hf_prefixed["transformer." + k] = v;
    hf_ptr = &hf_prefixed;
  }
  Source hf(*hf_ptr, "Hugging Face");
  TensorMap out;
  const ModelDims s = model_dims(a);
  check_layers_fit(f, s);
  const int64_t h = s.h, V = s.V;
  const std::string word = f == HfFamily::GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  out["embedding.word_embeddings.weight"] = resize_rows(hf.take(word, {V, h}), padded_vocab);
  const DType dt = out["embedding.word_embeddings.weight"].dtype;
  for (int i = 0; i < m.num_layers; ++i) {
    if (f == HfFamily::GPT2) gpt2_layer_from_hf(hf, out, i, s);
    else llama_layer_from_hf(f, hf, out, i, s, dt);
  }
  if (f == HfFamily::GPT2) {
    out["embedding.position_embeddings.weight"] =
        hf.take("transformer.wpe.weight", {int64_t(m.max_position_embeddings), h});
    out["decoder.final_layernorm.weight"] = hf.take("transformer.ln_f.weight", {h});
    out["decoder.final_layernorm.bias"] = hf.take("transformer.ln_f.bias", {h});
    if (hf.has("lm_head.weight")) hf.take("lm_head.weight", {V, h});  // tied: the same values as wte
  } else {
    out["decoder.final_layernorm.weight"] = hf.take("model.norm.weight", {h});
    if (m.untie_embeddings_and_output_weights)
      out["output_layer.weight"] = resize_rows(hf.take("lm_head.weight", {V, h}), padded_vocab);
    else if (hf.has("lm_head.weight"))
      hf.take("lm_head.weight", {V, h});  // tied checkpoints may still store it
  }
  std::vector<std::string> unused = hf.unused([](const std::string& k) {
    return k.find("rotary_emb.inv_freq") != std::string::npos || k.ends_with(".attn.bias") ||
           k.ends_with(".attn.masked_bias");
  });
  MEGATRON_CHECK(unused.empty(), "convert: the Hugging Face checkpoint holds ", unused.size(),
                 " tensors this conversion does not use (an unsupported feature?), e.g. '", unused.front(), "'");
  return m.apply_layernorm_1p ? shift_norm_weights(std::move(out), -1.0) : out;
}

TensorMap megatron_to_hf(HfFamily f, const train::Arguments& a, const TensorMap& ours_in,
                         std::vector<std::string>* warnings) {
  const train::ModelArguments& m = a.model;
  Source ours(ours_in, "megatron.cpp");
  TensorMap out;
  const ModelDims s = model_dims(a);
  check_layers_fit(f, s);
  const int64_t h = s.h, n = s.n, g = s.g, d = s.d, V = s.V;
  // Padded rows as stored (the padding depends on the TP the checkpoint was made for).
  const auto word_it = ours_in.find("embedding.word_embeddings.weight");
  const int64_t padded = word_it == ours_in.end() || word_it->second.shape.empty() ? V : word_it->second.shape[0];
  MEGATRON_CHECK(padded >= V, "convert: the embedding has ", padded, " rows, fewer than the vocabulary's ", V);
  const DropTensor drop{f, warnings};
  const HostTensor& word = ours.take("embedding.word_embeddings.weight", {padded, h});
  const std::string word_name = f == HfFamily::GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  out[word_name] = resize_rows(word, V);
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    const HostTensor& qkv = ours.take(p + "self_attention.linear_qkv.weight", {g * (n / g + 2) * d, h});
    HostTensor q, k, v;
    split_qkv(qkv, n, g, d, q, k, v);
    if (f == HfFamily::GPT2) gpt2_layer_to_hf(ours, out, i, s, q, k, v);
    else llama_layer_to_hf(f, ours, out, i, s, q, k, v, drop);
  }
  if (f == HfFamily::GPT2) {
    out["transformer.wpe.weight"] = ours.take("embedding.position_embeddings.weight", {int64_t(m.max_position_embeddings), h});
    out["transformer.ln_f.weight"] = ours.take("decoder.final_layernorm.weight", {h});
    out["transformer.ln_f.bias"] = ours.take("decoder.final_layernorm.bias", {h});
  } else {
    out["model.norm.weight"] = ours.take("decoder.final_layernorm.weight", {h});
    if (m.untie_embeddings_and_output_weights)
      out["lm_head.weight"] = resize_rows(ours.take("output_layer.weight", {padded, h}), V);
  }
  std::vector<std::string> unused = ours.unused([](const std::string& k) { return k.rfind("optimizer.", 0) == 0; });
  MEGATRON_CHECK(unused.empty(), "convert: ", unused.size(), " tensors of the megatron.cpp checkpoint have no ",
                 hf_family_name(f), " counterpart, e.g. '", unused.front(), "'");
  return m.apply_layernorm_1p ? shift_norm_weights(std::move(out), 1.0) : out;
}

void cast_floats(TensorMap& tensors, DType dtype) {
  for (auto& [name, t] : tensors) {
    if (!is_floating(t.dtype) || t.dtype == dtype) continue;
    HostTensor c = make(dtype, t.shape);
    visit_dtype(dtype, [&]<class D>() {
      visit_dtype(t.dtype, [&]<class S>() {
        const S* s = reinterpret_cast<const S*>(t.bytes.data());
        D* d = reinterpret_cast<D*>(c.bytes.data());
        for (int64_t i = 0; i < t.numel(); ++i) d[i] = from_double<D>(to_double(s[i]));
      });
    });
    t = std::move(c);
  }
}

}  // namespace megatron::checkpoint
