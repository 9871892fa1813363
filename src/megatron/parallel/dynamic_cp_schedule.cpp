#include "megatron/parallel/dynamic_cp_schedule.h"

#include <algorithm>
#include <numeric>

#include "megatron/core/error.h"

namespace megatron::parallel {
namespace {

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The lowest aligned free block of `size` ranks in `busy`, or -1.
int free_block(const std::vector<bool>& busy, int size) {
  for (int first = 0; first + size <= int(busy.size()); first += size)
    if (std::none_of(busy.begin() + first, busy.begin() + first + size, [](bool b) { return b; })) return first;
  return -1;
}

// Megatron's fill_empty_gpus: the runs of the last wave grow, the smallest first, until they cover every rank,
// then are placed again largest first on the lowest aligned blocks. A smaller run's micro-batch takes longer
// per rank (its tokens over fewer ranks), so it decides how long the wave lasts; doubling it shortens the wave
// and gives the idle ranks its work. Sizes stay powers of two summing to cp_size: the smallest run's size
// divides both what is covered and cp_size, so doubling it never overshoots, and the placement leaves no hole.
void fill_last_wave(CpWave& wave, int cp_size) {
  int covered = 0;
  for (const CpRun& r : wave.runs) covered += r.size;
  while (covered < cp_size) {
    CpRun* smallest = &wave.runs.front();
    for (CpRun& r : wave.runs)
      if (r.size <= smallest->size) smallest = &r;  // ties: the one placed last
    covered += smallest->size;
    smallest->size *= 2;
  }
  std::stable_sort(wave.runs.begin(), wave.runs.end(), [](const CpRun& a, const CpRun& b) { return a.size > b.size; });
  int first = 0;
  for (CpRun& r : wave.runs) {
    r.first_rank = first;
    first += r.size;
  }
}

}  // namespace

int dynamic_cp_size(int64_t longest, int64_t max_seqlen_per_rank, int cp_size) {
  MEGATRON_CHECK(max_seqlen_per_rank > 0, "--max-seqlen-per-dp-cp-rank must be positive, got ", max_seqlen_per_rank);
  MEGATRON_CHECK(power_of_two(cp_size), "dynamic context parallelism needs a power-of-two --context-parallel-size, got ",
                 cp_size);
  int c = 1;
  while (c < cp_size && int64_t(c) * max_seqlen_per_rank < longest) c *= 2;
  return c;
}

std::vector<CpWave> plan_dynamic_cp(std::span<const int64_t> longest, int64_t max_seqlen_per_rank, int cp_size) {
  std::vector<int> size(longest.size());
  for (size_t m = 0; m < longest.size(); ++m) size[m] = dynamic_cp_size(longest[m], max_seqlen_per_rank, cp_size);
  std::vector<int64_t> order(longest.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return size[size_t(a)] > size[size_t(b)]; });

  std::vector<CpWave> plan;
  std::vector<std::vector<bool>> busy;
  for (int64_t m : order) {
    const int c = size[size_t(m)];
    size_t w = 0;
    int first = -1;
    for (; w < plan.size() && (first = free_block(busy[w], c)) < 0; ++w) {
    }
    if (w == plan.size()) {
      plan.emplace_back();
      busy.emplace_back(size_t(cp_size), false);
      first = 0;
    }
    std::fill(busy[w].begin() + first, busy[w].begin() + first + c, true);
    plan[w].runs.push_back({m, first, c});
  }
  for (CpWave& wave : plan)
    std::sort(wave.runs.begin(), wave.runs.end(), [](const CpRun& a, const CpRun& b) { return a.first_rank < b.first_rank; });
  if (!plan.empty()) fill_last_wave(plan.back(), cp_size);
  return plan;
}

std::vector<CpRun> runs_of_rank(const std::vector<CpWave>& plan, int rank) {
  std::vector<CpRun> out;
  for (const CpWave& wave : plan) {
    CpRun idle{-1, rank, 1};
    for (const CpRun& r : wave.runs)
      if (r.first_rank <= rank && rank < r.first_rank + r.size) idle = r;
    out.push_back(idle);
  }
  return out;
}

}  // namespace megatron::parallel
