#include "megatron/trainer/layout_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/train/flops.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/memory_plan.h"

namespace megatron::trainer {

namespace {

constexpr double kBf16StepRate = 550e12;  // FLOP/s per GPU, whole training steps on one H100 (bench/RESULTS.md)
constexpr double kFp8StepRate = 700e12;
constexpr double kTpBytesPerSecond = 300e9;
constexpr double kFsdpBytesPerSecond = 270e9;
constexpr double kFsdpExposedShare = 0.58;
constexpr double kHostUpdateParamsPerSecond = 2.6e9;  // the 0.89B at offload 1.0 on one H200 host (16 cores)
constexpr double kOffloadFractions[] = {0.25, 0.5, 0.75, 1.0};

// The model's parameters (norms and biases left out), from the terms of Megatron's FLOPs formula; an MoE layer's
// MLP is its experts' and shared experts' (every expert: what FSDP gathers and an offload updates).
double model_parameters(const train::Arguments& a) {
  const train::ModelArguments& m = a.model;
  const double k = m.swiglu ? 3 : 2;
  const nn::MoeConfig moe = train::moe_config(a.moe, m);
  double layers = 0;
  for (int i = 0; i < m.num_layers; ++i) {
    const double mlp = moe.is_moe_layer(i)
                           ? double(m.hidden_size) * k * (moe.num_experts * double(moe.ffn_hidden_size) + moe.shared_expert_ffn)
                           : double(m.hidden_size) * k * m.ffn_hidden_size;
    layers += mlp + double(m.hidden_size) * m.kv_channels * (2.0 * m.num_attention_heads + 2.0 * m.num_query_groups);
  }
  const double embeddings = double(m.hidden_size) * a.padded_vocab_size() *
                            (m.untie_embeddings_and_output_weights ? 2 : 1);
  return layers + embeddings;
}

// The flags of one candidate, validated; false when Megatron's rules refuse it (the reason in *refusal).
bool candidate_args(const train::Arguments& base, int gpus, int tp, int pp, int cp, int ep, const std::string& recompute,
                    bool fsdp, double offload, train::Arguments& out, std::string* refusal = nullptr) {
  out = base;
  train::ParallelArguments& p = out.parallel;
  p.world_size = gpus;
  p.tensor_model_parallel_size = tp;
  p.expert_model_parallel_size = ep;
  p.pipeline_model_parallel_size = pp;
  p.context_parallel_size = cp;
  p.sequence_parallel = tp > 1;
  p.use_distributed_optimizer = true;
  p.use_megatron_fsdp = fsdp;
  p.data_parallel_sharding_strategy = "optim_grads_params";
  if (fsdp) p.overlap_grad_reduce = p.overlap_param_gather = true;
  out.training.optimizer_cpu_offload = offload > 0;
  out.training.optimizer_offload_fraction = offload > 0 ? offload : 1.0;
  p.virtual_pipeline_model_parallel_size = 0;
  p.num_layers_per_virtual_pipeline_stage = 0;
  p.num_virtual_stages_per_pipeline_rank = 0;
  p.pipeline_model_parallel_layout.clear();  // a layout is written for one pipeline size
  train::RecomputeArguments& r = out.recompute;
  r = {};
  if (recompute == "full") r = {.recompute_granularity = "full", .recompute_method = "uniform", .recompute_num_layers = 1};
  if (recompute == "selective mlp") r = {.recompute_granularity = "selective", .recompute_modules = {"mlp"}};
  out.training.dry_run = false;
  try {
    train::resolve_and_validate(out);
  } catch (const std::exception& e) {
    if (refusal != nullptr) *refusal = e.what();
    return false;
  }
  return true;
}

double step_seconds(const train::Arguments& a, const std::string& recompute) {
  const train::ModelArguments& m = a.model;
  const int gbs = a.training.global_batch_size;
  const double flops = train::num_floating_point_operations(a, gbs);
  const double rate = a.fp8.fp8_format.empty() ? kBf16StepRate : kFp8StepRate;
  double compute = flops / (double(a.parallel.world_size) * rate);
  const double k = m.swiglu ? 3 : 2;
  const double mlp = 6.0 * m.hidden_size * k * m.ffn_hidden_size * m.num_layers;
  // Per token: the MLPs', the attention projections' (QKV and output) and the logits' FLOPs (flops.h's terms).
  const double attention = 6.0 * m.num_layers * m.hidden_size * m.kv_channels *
                           (2.0 * m.num_attention_heads + 2.0 * m.num_query_groups);
  const double per_token = mlp + attention + 6.0 * m.hidden_size * a.padded_vocab_size();
  if (recompute == "full") compute *= 1.0 + (mlp + attention) / per_token / 3.0;
  if (recompute == "selective mlp") compute *= 1.0 + mlp / per_token / 3.0;
  const int M = a.num_micro_batches(), V = std::max(1, a.parallel.virtual_pipeline_size), P = a.parallel.pipeline_model_parallel_size;
  const double bubble = compute * double(P - 1) / double(M * V);
  double tp_comm = 0;
  const int tp = a.parallel.tensor_model_parallel_size;
  if (tp > 1) {
    const double hidden_bytes = double(a.training.micro_batch_size) * m.seq_length / a.parallel.context_parallel_size *
                                m.hidden_size * (a.training.bf16 || a.training.fp16 ? 2 : 4);
    const double layers_here = double(m.num_layers) / P;
    tp_comm = 10.0 * layers_here * M * hidden_bytes * (tp - 1) / tp / kTpBytesPerSecond;
    if (a.parallel.tp_comm_overlap) tp_comm /= 2;
  }
  const int dp = a.data_parallel_size();
  const double model_parallel_params = model_parameters(a) / (double(tp) * P);
  double fsdp_comm = 0;
  if (a.parallel.use_megatron_fsdp && dp > 1)
    fsdp_comm = M * 8.0 * model_parallel_params * (dp - 1) / dp / kFsdpBytesPerSecond * kFsdpExposedShare;
  double host_update = 0;
  if (a.training.optimizer_cpu_offload)
    host_update = a.training.optimizer_offload_fraction * model_parallel_params / dp / kHostUpdateParamsPerSecond;
  return compute + bubble + tp_comm + fsdp_comm + host_update;
}

std::vector<int> powers_of_two_up_to(int n) {
  std::vector<int> out;
  for (int v = 1; v <= n; v *= 2) out.push_back(v);
  return out;
}

}  // namespace

// The expert-parallel sizes to try: for an MoE model every power of two dividing the experts (validation keeps
// those that divide the ranks); else the flags' own (1).
std::vector<int> expert_parallel_sizes(const train::Arguments& base, int gpus) {
  if (base.moe.num_experts <= 0) return {base.parallel.expert_model_parallel_size};
  std::vector<int> out;
  for (int ep : powers_of_two_up_to(gpus))
    if (base.moe.num_experts % ep == 0) out.push_back(ep);
  return out;
}

double host_bytes_for_offload(const LayoutBudget& budget, int gpus) {
  const int ranks = std::min(gpus, budget.gpus_per_node);
  return std::max(0.0, 0.9 * budget.host_bytes_per_node - ranks * kHostBytesPerRank);
}

double offload_bytes_per_node(double most_host_bytes_of_a_rank, const LayoutBudget& budget, int gpus) {
  return most_host_bytes_of_a_rank * std::min(gpus, budget.gpus_per_node);
}

std::vector<LayoutCandidate> search_layouts(const train::Arguments& base, int gpus, const LayoutBudget& budget) {
  const double host_room = host_bytes_for_offload(budget, gpus);
  std::vector<LayoutCandidate> out;
  for (int tp : powers_of_two_up_to(std::min(gpus, 8)))
    for (int pp = 1; pp <= std::min(gpus / tp, base.model.num_layers); ++pp)
      for (int cp : powers_of_two_up_to(gpus / (tp * pp)))
        for (int ep : expert_parallel_sizes(base, gpus))
        for (const char* recompute : {"none", "selective mlp", "full"}) {
          if (gpus % (tp * pp * cp) != 0) continue;
          // The distributed optimizer, else the smallest offload that fits; and FSDP where DP > 1.
          const auto consider = [&](bool fsdp, double offload, const std::string& state) {
            train::Arguments a;
            if (!candidate_args(base, gpus, tp, pp, cp, ep, recompute, fsdp, offload, a)) return false;
            if (fsdp && a.data_parallel_size() == 1) return false;
            const MemoryPlan plan = plan_memory(a);
            const double peak = plan.worst().peak;
            if (peak > budget.gpu_bytes) return false;
            if (offload > 0 && offload_bytes_per_node(plan.most_host_bytes(), budget, gpus) > host_room) return false;
            out.push_back({.tp = tp, .pp = pp, .cp = cp, .dp = a.data_parallel_size(), .ep = ep,
                           .recompute = recompute, .state = state, .peak_bytes = peak,
                           .step_seconds = step_seconds(a, recompute)});
            return true;
          };
          if (!consider(false, 0, "distributed optimizer"))
            for (double f : kOffloadFractions)
              if (consider(false, f, str_cat("offload ", f))) break;
          consider(true, 0, "fsdp");
        }
  // Equal estimates: more data parallelism first (its collectives overlap best: 97-98% of linear scaling
  // measured on 2 H200s, while context parallelism's ring costs attention time the estimate leaves out), then
  // the smaller peak.
  std::sort(out.begin(), out.end(), [](const LayoutCandidate& x, const LayoutCandidate& y) {
    if (x.step_seconds != y.step_seconds) return x.step_seconds < y.step_seconds;
    if (x.dp != y.dp) return x.dp > y.dp;
    if (x.ep != y.ep) return x.ep < y.ep;
    return x.peak_bytes < y.peak_bytes;
  });
  return out;
}

double estimated_step_seconds(const train::Arguments& args) {
  const train::RecomputeArguments& r = args.recompute;
  const auto& modules = r.recompute_modules;
  const bool mlp = std::find(modules.begin(), modules.end(), "mlp") != modules.end();
  const std::string recompute = r.recompute_granularity == "full"                ? "full"
                                : r.recompute_granularity == "selective" && mlp ? "selective mlp"
                                                                                : "none";
  return step_seconds(args, recompute);
}

std::string describe(const std::vector<LayoutCandidate>& layouts, const train::Arguments& base, int gpus,
                     const LayoutBudget& budget) {
  std::ostringstream out;
  const double gib = double(1ull << 30);
  out << "layouts of " << gpus << " GPUs whose predicted peak fits " << budget.gpu_bytes / gib << " GiB";
  if (std::isfinite(budget.host_bytes_per_node))
    out << " and whose offloaded optimizer state fits " << host_bytes_for_offload(budget, gpus) / gib
        << " GiB of a node's host memory (" << budget.host_bytes_per_node / gib << " GiB for "
        << std::min(gpus, budget.gpus_per_node) << " GPUs)";
  out << ", by estimated step time (trainer/layout_search.h says how it is estimated):\n";
  if (layouts.empty()) {
    // Flags that no layout can make valid (a missing --train-iters, say) are not a memory problem: say which.
    train::Arguments plain;
    std::string refusal;
    if (!candidate_args(base, gpus, 1, 1, 1, 1, "none", false, 0, plain, &refusal))
      out << "  none: the flags are refused even as plain data parallelism over " << gpus << " GPUs: " << refusal
          << "\n";
    else
      out << "  none: no TP x PP x CP x DP split with any recomputation, FSDP or optimizer offload fits (the GPU, "
             "and the host for what an offload pins there); try more GPUs or a smaller micro-batch\n";
    return out.str();
  }
  char line[200];
  const bool moe = base.moe.num_experts > 0;  // an EP column
  std::snprintf(line, sizeof line, "  %4s %4s %4s %4s%s  %-14s %-22s %10s %12s %14s\n", "TP", "PP", "CP", "DP",
                moe ? "   EP" : "", "recompute", "model state", "peak GiB", "est. step s", "est. tokens/s");
  out << line;
  const double tokens = double(base.training.global_batch_size) * base.model.seq_length;
  for (size_t i = 0; i < std::min<size_t>(layouts.size(), 12); ++i) {
    const LayoutCandidate& c = layouts[i];
    char ep[16] = "";
    if (moe) std::snprintf(ep, sizeof ep, " %4d", c.ep);
    std::snprintf(line, sizeof line, "  %4d %4d %4d %4d%s  %-14s %-22s %10.2f %12.3f %14.0f\n", c.tp, c.pp, c.cp, c.dp,
                  ep, c.recompute.c_str(), c.state.c_str(), c.peak_bytes / gib, c.step_seconds,
                  tokens / c.step_seconds);
    out << line;
  }
  if (layouts.size() > 12) out << "  ... and " << layouts.size() - 12 << " more that fit\n";
  return out.str();
}

}  // namespace megatron::trainer
