#include "megatron/trainer/layout_search.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "megatron/train/flops.h"
#include "megatron/trainer/memory_plan.h"

namespace megatron::trainer {

namespace {

constexpr double kBf16StepRate = 550e12;  // FLOP/s per GPU, whole training steps on one H100 (bench/RESULTS.md)
constexpr double kFp8StepRate = 700e12;
constexpr double kTpBytesPerSecond = 300e9;

// The flags of one candidate, validated; false when Megatron's rules refuse it.
bool candidate_args(const train::Arguments& base, int gpus, int tp, int pp, int cp, const std::string& recompute,
                    train::Arguments& out) {
  out = base;
  train::ParallelArguments& p = out.parallel;
  p.world_size = gpus;
  p.tensor_model_parallel_size = tp;
  p.pipeline_model_parallel_size = pp;
  p.context_parallel_size = cp;
  p.sequence_parallel = tp > 1;
  p.use_distributed_optimizer = true;
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
  } catch (const std::exception&) {
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
  return compute + bubble + tp_comm;
}

std::vector<int> powers_of_two_up_to(int n) {
  std::vector<int> out;
  for (int v = 1; v <= n; v *= 2) out.push_back(v);
  return out;
}

}  // namespace

std::vector<LayoutCandidate> search_layouts(const train::Arguments& base, int gpus, double gpu_bytes) {
  std::vector<LayoutCandidate> out;
  for (int tp : powers_of_two_up_to(std::min(gpus, 8)))
    for (int pp = 1; pp <= std::min(gpus / tp, base.model.num_layers); ++pp)
      for (int cp : powers_of_two_up_to(gpus / (tp * pp)))
        for (const char* recompute : {"none", "selective mlp", "full"}) {
          if (gpus % (tp * pp * cp) != 0) continue;
          train::Arguments a;
          if (!candidate_args(base, gpus, tp, pp, cp, recompute, a)) continue;
          const MemoryPlan plan = plan_memory(a);
          const double peak = plan.worst().peak;
          if (peak > gpu_bytes) continue;
          out.push_back({.tp = tp, .pp = pp, .cp = cp, .dp = a.data_parallel_size(), .recompute = recompute,
                         .peak_bytes = peak, .step_seconds = step_seconds(a, recompute)});
        }
  // Equal estimates: more data parallelism first (its collectives overlap best: 97-98% of linear scaling
  // measured on 2 H200s, while context parallelism's ring costs attention time the estimate leaves out), then
  // the smaller peak.
  std::sort(out.begin(), out.end(), [](const LayoutCandidate& x, const LayoutCandidate& y) {
    if (x.step_seconds != y.step_seconds) return x.step_seconds < y.step_seconds;
    if (x.dp != y.dp) return x.dp > y.dp;
    return x.peak_bytes < y.peak_bytes;
  });
  return out;
}

std::string describe(const std::vector<LayoutCandidate>& layouts, const train::Arguments& base, int gpus,
                     double gpu_bytes) {
  std::ostringstream out;
  const double gib = double(1ull << 30);
  out << "layouts of " << gpus << " GPUs whose predicted peak fits " << gpu_bytes / gib
      << " GiB, by estimated step time (trainer/layout_search.h says how it is estimated):\n";
  if (layouts.empty()) {
    out << "  none: no TP x PP x CP x DP split with any recomputation fits; try more GPUs, a smaller micro-batch or "
           "--optimizer-cpu-offload\n";
    return out.str();
  }
  char line[200];
  std::snprintf(line, sizeof line, "  %4s %4s %4s %4s  %-14s %10s %12s %14s\n", "TP", "PP", "CP", "DP", "recompute",
                "peak GiB", "est. step s", "est. tokens/s");
  out << line;
  const double tokens = double(base.training.global_batch_size) * base.model.seq_length;
  for (size_t i = 0; i < std::min<size_t>(layouts.size(), 12); ++i) {
    const LayoutCandidate& c = layouts[i];
    std::snprintf(line, sizeof line, "  %4d %4d %4d %4d  %-14s %10.2f %12.3f %14.0f\n", c.tp, c.pp, c.cp, c.dp,
                  c.recompute.c_str(), c.peak_bytes / gib, c.step_seconds, tokens / c.step_seconds);
    out << line;
  }
  if (layouts.size() > 12) out << "  ... and " << layouts.size() - 12 << " more that fit\n";
  return out.str();
}

}  // namespace megatron::trainer
