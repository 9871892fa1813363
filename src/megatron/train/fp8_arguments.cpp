#include "megatron/train/fp8_arguments.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::train {

namespace {

// Recipes Megatron offers that need other hardware or a GEMM path this implementation does not have.
void refused_recipes(const Fp8Arguments& f, std::vector<std::string>& v) {
  if (f.fp8_recipe == "mxfp8")
    v.push_back("--fp8-recipe mxfp8 needs Blackwell (MXFP8 tensor cores, compute capability 10.0); these GPUs are "
                "Hopper. Use --fp8-recipe delayed, tensorwise or blockwise (ops/microscaling emulates MXFP8 on the CPU)");
  if (f.fp8_recipe == "custom")
    v.push_back("--fp8-recipe custom loads a Python quantizer factory, which a C++ trainer cannot: use --fp8-recipe "
                "delayed, tensorwise or blockwise");
  if (!f.fp4_format.empty())
    v.push_back("--fp4-format " + f.fp4_format + " (recipe " + f.fp4_recipe +
                ") needs Blackwell (FP4 tensor cores); these GPUs are Hopper (ops/microscaling emulates the E2M1 "
                "quantisation on the CPU)");
  if (f.no_fp8_wgrad)
    v.push_back("--no-fp8-wgrad is not supported: the weight-gradient GEMM always runs in FP8 here");
}

}  // namespace

std::vector<std::string> fp8_violations(const Arguments& a) {
  const Fp8Arguments& f = a.fp8;
  std::vector<std::string> v;
  auto need = [&](bool ok, auto&&... parts) {
    if (!ok) v.push_back(str_cat(parts...));
  };
  refused_recipes(f, v);
  if (!f.fp4_format.empty()) need(f.fp8_format.empty(), "--fp4-format and --fp8-format cannot be used together");
  if (f.fp8_format.empty()) {
    need(!f.fp8_param_gather, "--fp8-param-gather needs --fp8-format");
    need(!f.first_last_layers_bf16, "--first-last-layers-bf16 needs --fp8-format");
    return v;
  }
  need(f.fp8_margin >= 0, "--fp8-margin ", f.fp8_margin, " must be >= 0");
  need(f.fp8_amax_history_len >= 1, "--fp8-amax-history-len ", f.fp8_amax_history_len, " must be >= 1");
  need(!a.training.fp16, "--fp8-format with --fp16: FP8 here trains on bf16 (or, on the CPU, fp32) parameters; use --bf16");
  if (f.fp8_param_gather) {
    // A 128 x 128 block straddles the distributed optimizer's flat shards, so quantising the shards would need
    // each block's amax reduced over the DP ranks first; that path is not written.
    need(f.fp8_recipe != "blockwise", "--fp8-param-gather with --fp8-recipe blockwise is not supported here (the "
                                      "distributed optimizer quantises per-tensor scaled shards only): drop "
                                      "--fp8-param-gather, or use --fp8-recipe delayed or tensorwise");
    // The distributed optimizer keeps the FP8 weights' only high-precision copy and quantises into them.
    need(a.parallel.use_distributed_optimizer && !a.parallel.use_megatron_fsdp,
         "--fp8-param-gather needs --use-distributed-optimizer (without --use-megatron-fsdp): the distributed "
         "optimizer quantises its fp32 master weights into the FP8 weights and all-gathers those");
    need(!a.training.optimizer_cpu_offload, "--fp8-param-gather with --optimizer-cpu-offload: the FP8 weights are "
                                            "quantised on the GPU from masters kept there; drop one of the two");
  }
  if (f.first_last_layers_bf16) {
    need(f.fp8_recipe != "delayed", "--first-last-layers-bf16 does not work with --fp8-recipe delayed (Megatron's "
                                    "rule: delayed scaling does not support first / last layers in bf16)");
    const int pp = std::max(1, a.parallel.pipeline_model_parallel_size);
    const int per_stage = a.model.num_layers / pp;
    need(f.num_layers_at_start_in_bf16 >= 0 && f.num_layers_at_start_in_bf16 <= per_stage,
         "--num-layers-at-start-in-bf16 ", f.num_layers_at_start_in_bf16,
         " must be between 0 and the layers per pipeline stage (", per_stage, ")");
    need(f.num_layers_at_end_in_bf16 >= 0 && f.num_layers_at_end_in_bf16 <= per_stage,
         "--num-layers-at-end-in-bf16 ", f.num_layers_at_end_in_bf16,
         " must be between 0 and the layers per pipeline stage (", per_stage, ")");
  }
  return v;
}

nn::Fp8Recipe fp8_recipe(const Arguments& args) {
  const Fp8Arguments& f = args.fp8;
  nn::Fp8Recipe r;
  r.enabled = !f.fp8_format.empty();
  if (!r.enabled) return r;
  r.format = f.fp8_format == "e4m3" ? nn::Fp8Format::E4M3 : nn::Fp8Format::Hybrid;
  r.scaling = f.fp8_recipe == "tensorwise"  ? nn::Fp8Scaling::Tensorwise
              : f.fp8_recipe == "blockwise" ? nn::Fp8Scaling::Blockwise
                                            : nn::Fp8Scaling::Delayed;
  r.margin = f.fp8_margin;
  r.amax_history_len = f.fp8_amax_history_len;
  r.amax_compute_max = f.fp8_amax_compute_algo == "max";
  if (f.first_last_layers_bf16) {
    r.layers_at_start_in_bf16 = f.num_layers_at_start_in_bf16;
    r.layers_at_end_in_bf16 = f.num_layers_at_end_in_bf16;
  }
  return r;
}

}  // namespace megatron::train
