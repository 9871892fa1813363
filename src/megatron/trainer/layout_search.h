// Which layouts of a model fit a number of GPUs, best first (`pretrain_gpt ... --dry-run-layouts N`): every
// TP x PP x CP x DP split of N GPUs the flags' model and batch allow (Megatron's divisibility rules, checked by
// the same validation as a real launch) -- for an MoE model with every expert-parallel size (a power of two
// dividing the experts; --expert-tensor-parallel-size as given) -- each with no, selective (mlp) and full
// recomputation, sequence
// parallelism on, and the model state kept three ways: the distributed optimizer; Megatron FSDP
// (optim_grads_params, both overlap flags) where DP > 1; and, where the distributed optimizer does not fit, the
// same with the smallest optimizer CPU offload fraction of 0.25, 0.5, 0.75, 1 that fits. The memory plan
// (memory_plan.h) of each, kept when its peak fits the GPU and its offloaded state fits the host: the most
// pinned host memory any rank's offload takes, times the ranks of a node (min(N, gpus_per_node)), within the
// node's memory less a tenth (the OS, the page cache) and kHostBytesPerRank per rank (its process: the CUDA
// context, libraries, the data pipeline). Ordered by an estimated step time.
//
// The step-time estimate (not yet checked against multi-GPU measurements):
//   compute = Megatron's FLOPs / (N x the whole-step rate measured on one H100: 550 TFLOP/s in bf16, 700 with
//             FP8 linears; bench/RESULTS.md), times the recomputed share (full: the layers' forward again,
//             a third of their FLOPs; selective mlp: the MLPs' forward);
//   pipeline bubble: compute x (PP - 1) / (micro-batches x virtual stages), Megatron's formula;
//   tensor parallelism: the sequence-parallel all-gathers and reduce-scatters not hidden (10 per layer and
//             micro-batch, each moving (TP - 1) / TP of the micro-batch's hidden states) at 300 GB/s per GPU
//             (NVLink, an assumption), halved with --tp-comm-overlap;
//   FSDP: each micro-batch all-gathers the rank's model-parallel parameters twice (bf16) and reduce-scatters
//             their fp32 gradients, 8 bytes a parameter x (DP - 1) / DP, at 270 GB/s with 58% of it not hidden
//             (both measured at Llama-3-8B DP = 2 on 2 H200s, bench/RESULTS.md: the one calibration point);
//   optimizer offload: the host update of the offloaded masters and moments at 2.6 G parameters/s per rank,
//             not overlapped (the 0.89B at offload 1.0 on one H200's host of 16 cores, bench/RESULTS.md);
//   expert parallelism: its token all-to-alls are not counted (on 2 H200s EP=2 kept 94-96% of EP=1's tokens/s
//             per GPU, bench/RESULTS.md), so equal estimates list the smaller EP first;
//   data and context parallelism otherwise: overlapped with compute (their collectives are not counted; context
//             parallelism's ring slows attention by 6-34% on one GPU, bench/RESULTS.md, which this leaves out,
//             so equal estimates list more data parallelism first).
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::trainer {

struct LayoutCandidate {
  int tp = 1, pp = 1, cp = 1, dp = 1;
  int ep = 1;                // expert parallelism (MoE models; it folds over DP x CP x TP)
  std::string recompute;     // "none", "selective mlp", "full"
  std::string state;         // "distributed optimizer", "fsdp", "offload 0.25" ... "offload 1"
  double peak_bytes = 0;     // the memory plan's worst rank
  double step_seconds = 0;   // the estimate above
};

// What a layout must fit in: memory per GPU, and the host memory its ranks on one node share (what optimizer
// offload pins there).
struct LayoutBudget {
  double gpu_bytes = 0;  // usable per GPU
  double host_bytes_per_node = std::numeric_limits<double>::infinity();
  int gpus_per_node = 8;
};
inline constexpr double kHostBytesPerRank = 4.0 * double(1ull << 30);

// The host memory a node's ranks may pin for offloaded optimizer state (the rule above; 0 when none is left).
double host_bytes_for_offload(const LayoutBudget& budget, int gpus);
// The pinned host memory a plan's offload takes on one node of `gpus` GPUs: its largest rank's, times the node's
// ranks.
double offload_bytes_per_node(double most_host_bytes_of_a_rank, const LayoutBudget& budget, int gpus);

// base: the run's flags, parsed (not necessarily valid for `gpus` ranks).
std::vector<LayoutCandidate> search_layouts(const train::Arguments& base, int gpus, const LayoutBudget& budget);

std::string describe(const std::vector<LayoutCandidate>& layouts, const train::Arguments& base, int gpus,
                     const LayoutBudget& budget);

// The step-time estimate above for one resolved run, its recomputation read from its flags (selective
// recomputation counts as "selective mlp" when it recomputes the MLPs, else as none). `--dry-run` prints it, so
// a measured layout can be set beside the planner's figure for it.
double estimated_step_seconds(const train::Arguments& args);

}  // namespace megatron::trainer
