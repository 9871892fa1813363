// Which layouts of a model fit a number of GPUs, best first (`pretrain_gpt ... --dry-run-layouts N`): every
// TP x PP x CP x DP split of N GPUs the flags' model and batch allow (Megatron's divisibility rules, checked by
// the same validation as a real launch), each with no, selective (mlp) and full recomputation, the distributed
// optimizer and sequence parallelism on; the memory plan (memory_plan.h) of each, kept when its peak fits the
// GPU; ordered by an estimated step time.
//
// The step-time estimate (not yet checked against multi-GPU measurements):
//   compute = Megatron's FLOPs / (N x the whole-step rate measured on one H100: 550 TFLOP/s in bf16, 700 with
//             FP8 linears; bench/RESULTS.md), times the recomputed share (full: the layers' forward again,
//             a third of their FLOPs; selective mlp: the MLPs' forward);
//   pipeline bubble: compute x (PP - 1) / (micro-batches x virtual stages), Megatron's formula;
//   tensor parallelism: the sequence-parallel all-gathers and reduce-scatters not hidden (10 per layer and
//             micro-batch, each moving (TP - 1) / TP of the micro-batch's hidden states) at 300 GB/s per GPU
//             (NVLink, an assumption), halved with --tp-comm-overlap;
//   data and context parallelism: overlapped with compute (their collectives are not counted; context
//             parallelism's ring slows attention by 6-34% on one GPU, bench/RESULTS.md, which this leaves out,
//             so equal estimates list more data parallelism first).
#pragma once

#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::trainer {

struct LayoutCandidate {
  int tp = 1, pp = 1, cp = 1, dp = 1;
  std::string recompute;     // "none", "selective mlp", "full"
  double peak_bytes = 0;     // the memory plan's worst rank
  double step_seconds = 0;   // the estimate above
};

// base: the run's flags, parsed (not necessarily valid for `gpus` ranks). gpu_bytes: usable memory per GPU.
std::vector<LayoutCandidate> search_layouts(const train::Arguments& base, int gpus, double gpu_bytes);

std::string describe(const std::vector<LayoutCandidate>& layouts, const train::Arguments& base, int gpus,
                     double gpu_bytes);

}  // namespace megatron::trainer
