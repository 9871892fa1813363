// Dynamic context parallelism's plan (Megatron-Core's hybrid context parallelism, --hybrid-context-parallel
// with --max-seqlen-per-dp-cp-rank): with packed (THD) micro-batches of very different lengths, a fixed CP
// size splits even the short ones over every CP rank, where the split costs more in communication than it
// saves. Instead each micro-batch gets its own CP size, from its longest sample, and the CP ranks it leaves
// idle run other micro-batches at the same time.
//
// Contract (a pure function of the lengths; every rank computes the same plan):
// - The CP size of a micro-batch whose longest sample has L tokens is the smallest power of two c with
//   c * max_seqlen_per_rank >= L (Megatron's gpus_needed: max(1, 2^ceil(log2(L / max)))), capped at the
//   launch's CP size C (a power of two).
// - Sub-groups are aligned: a micro-batch of size c runs on CP ranks [k c, (k + 1) c) for some k, so the
//   sub-communicators a launch needs are the C / c aligned blocks of every power-of-two size c <= C.
// - A wave is a set of runs on disjoint ranks; the micro-batches are placed largest size first (ties in
//   micro-batch order) into the first wave with a free aligned block, the lowest such block. Power-of-two
//   blocks packed largest first leave no hole, so the plan has ceil(sum of sizes / C) waves, the fewest
//   possible; every wave but the last keeps all C ranks busy.
// - The last wave's runs then grow, the smallest first, to cover every rank (Megatron's fill_empty_gpus): a
//   micro-batch there may run on more ranks than it needs, never fewer, and no rank is idle in any wave.
//   (Without this, two CP ranks with an odd number of one-rank micro-batches differ by a whole micro-batch; on
//   two H200s one rank waited 10.6% of an iteration for the other, bench/RESULTS.md 2026-11-29.)
// - Each micro-batch appears in exactly one run. With every micro-batch at size C the plan is fixed CP:
//   one micro-batch per wave, in order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace megatron::parallel {

// The CP size of a micro-batch whose longest sample has `longest` tokens (see above).
int dynamic_cp_size(int64_t longest, int64_t max_seqlen_per_rank, int cp_size);

struct CpRun {
  int64_t micro_batch = 0;
  int first_rank = 0;  // the sub-group is CP ranks [first_rank, first_rank + size)
  int size = 1;
};

struct CpWave {
  std::vector<CpRun> runs;  // on disjoint ranks, by first_rank
};

// `longest`: each micro-batch's longest sample. Throws naming the value when cp_size is not a power of two
// or max_seqlen_per_rank is not positive.
std::vector<CpWave> plan_dynamic_cp(std::span<const int64_t> longest, int64_t max_seqlen_per_rank, int cp_size);

// What CP rank `rank` runs in each wave: the run holding it, or a run with micro_batch -1 when it is idle.
std::vector<CpRun> runs_of_rank(const std::vector<CpWave>& plan, int rank);

}  // namespace megatron::parallel
