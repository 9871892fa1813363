#include "megatron/train/recompute_arguments.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::train {

namespace {

// --recompute-activations is Megatron's older spelling of selective recomputation.
std::string granularity(const RecomputeArguments& r) {
  if (r.recompute_granularity.empty() && r.recompute_activations) return "selective";
  return r.recompute_granularity;
}

// The modules selective recomputation runs: Megatron's default is core_attn alone.
std::vector<std::string> modules(const RecomputeArguments& r) {
  return r.recompute_modules.empty() ? std::vector<std::string>{"core_attn"} : r.recompute_modules;
}

// Megatron's module names this implementation has no recomputation for, with the reason.
void refused_modules(const std::vector<std::string>& names, std::vector<std::string>& v) {
  for (const std::string& m : names) {
    if (m == "core_attn" || m == "mlp" || m == "layernorm" || m == "moe_act" || m == "moe" || m == "shared_experts")
      continue;
    if (m == "mla_up_proj" || m == "gdn_norm_out" || m == "gdp_in_proj" || m == "gdp_qkv" || m == "mhc")
      v.push_back("--recompute-modules " + m + " belongs to an attention variant this implementation does not have");
    else
      v.push_back("--recompute-modules '" + m + "' is not one of Megatron's modules (core_attn, mlp, layernorm, "
                  "moe_act, moe, shared_experts, mla_up_proj, ...)");
  }
}

}  // namespace

std::vector<std::string> recompute_violations(const Arguments& a) {
  const RecomputeArguments& r = a.recompute;
  const std::string g = granularity(r);
  std::vector<std::string> v;
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  if (g.empty()) {
    need(r.recompute_method.empty(), "--recompute-method ", r.recompute_method, " needs --recompute-granularity full");
    need(r.recompute_num_layers == 0, "--recompute-num-layers needs --recompute-granularity full");
    need(!r.distribute_saved_activations, "--distribute-saved-activations needs --recompute-granularity full");
    return v;
  }
  const int pp = std::max(1, a.parallel.pipeline_model_parallel_size);
  const int per_chunk = a.model.num_layers / pp / std::max(1, a.parallel.virtual_pipeline_size);
  if (g == "full") {
    need(!r.recompute_method.empty(), "--recompute-granularity full needs --recompute-method uniform or block");
    need(r.recompute_num_layers >= 1 && r.recompute_num_layers <= std::max(1, per_chunk),
         "--recompute-granularity full needs --recompute-num-layers between 1 and the layers of a pipeline chunk (",
         per_chunk, "); got ", r.recompute_num_layers);
  } else {
    need(r.recompute_num_layers == 0, "--recompute-num-layers must not be given with --recompute-granularity "
                                      "selective (Megatron: it recomputes the named modules of every layer)");
    refused_modules(modules(r), v);
  }
  if (r.distribute_saved_activations) {
    need(!a.parallel.sequence_parallel, "--distribute-saved-activations cannot be used with --sequence-parallel "
                                        "(the saved inputs are split over TP already)");
    need(a.parallel.tensor_model_parallel_size > 1, "--distribute-saved-activations splits the saved layer inputs "
         "over the tensor-parallel ranks: it needs --tensor-model-parallel-size > 1 (as Megatron)");
  }
  return v;
}

nn::RecomputeConfig recompute_config(const Arguments& a) {
  const RecomputeArguments& r = a.recompute;
  nn::RecomputeConfig c;
  const std::string g = granularity(r);
  if (g == "full") {
    c.granularity = nn::RecomputeGranularity::Full;
    c.method = r.recompute_method == "block" ? nn::RecomputeMethod::Block : nn::RecomputeMethod::Uniform;
    c.num_layers = std::max(1, r.recompute_num_layers);
    c.distribute_saved_activations = r.distribute_saved_activations;
  } else if (g == "selective") {
    c.granularity = nn::RecomputeGranularity::Selective;
    const std::vector<std::string> m = modules(r);
    c.mlp = std::find(m.begin(), m.end(), "mlp") != m.end();
    c.layernorm = std::find(m.begin(), m.end(), "layernorm") != m.end();
    c.moe_act = std::find(m.begin(), m.end(), "moe_act") != m.end();
    c.moe = std::find(m.begin(), m.end(), "moe") != m.end();
    c.shared_experts = std::find(m.begin(), m.end(), "shared_experts") != m.end();
  }
  return c;
}

}  // namespace megatron::train
