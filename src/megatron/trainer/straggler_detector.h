// StragglerDetector: Megatron's --log-straggler. Every --log-interval each rank measures its throughput over its
// own work in the interval -- reading and preparing its micro-batches (the batch-generator timer: host time, the
// uploads queued without waiting for the device) and running their forwards and backwards (forward-compute and
// backward-compute: device time on GPUs, so waiting for other ranks in the gradient reduction, the optimizer or
// pipeline receives does not count) -- as model FLOPs per rank over that time. Rank 0 prints Megatron's summary
// (the minimum and maximum time, data time and throughput with their ranks) and the --straggler-minmax-count
// slowest and fastest ranks with their relative throughput, their place in the layout (TP, PP, DP, CP ranks)
// and their host.
//
// What a slow rank shows: its own lower throughput; collectives inside forward and backward (tensor
// parallelism, overlapped gradient reduction) make the ranks that wait for it look slower too, so the report
// then names a tensor-parallel group rather than one rank.
#pragma once

#include <string>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/parallel/parallel_context.h"

namespace megatron::trainer {

struct RankPosition {
  int rank = 0, tp = 0, pp = 0, dp = 0, cp = 0;
  std::string host;
};

struct StragglerReport {
  std::string text;  // rank 0's print ("" elsewhere)
  int slowest_rank = 0, fastest_rank = 0;
  double slowest_tflops = 0, fastest_tflops = 0;  // per rank
};

class StragglerDetector {
 public:
  // Collective over the world: gathers every rank's layout position and host once.
  StragglerDetector(const parallel::ParallelContext& parallel, int minmax_count);

  // Collective over the world. Over `iterations` iterations (the last one `last_iteration`), this rank's own
  // work was `data_seconds` of reading and preparing micro-batches (batch-generator) and `compute_seconds` of
  // forwards and backwards; `tflop_per_rank`: the model FLOPs per iteration per rank in TFLOP (a rank's
  // throughput is that over its own work per iteration). The summary line also gives the data time per
  // iteration of the fastest and slowest readers (Megatron's MnDRtt/MxDRtt).
  StragglerReport report(double data_seconds, double compute_seconds, double iterations, double tflop_per_rank,
                         int64_t last_iteration);

  const std::vector<RankPosition>& positions() const { return positions_; }

 private:
  comm::Communicator& world_;
  int minmax_count_;
  std::vector<RankPosition> positions_;
};

// "rank 3 (tp 1, pp 0, dp 1, cp 0, host node-7)".
std::string describe(const RankPosition& p);

}  // namespace megatron::trainer
