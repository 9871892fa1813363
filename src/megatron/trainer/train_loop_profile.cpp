// TrainLoop's profiling report (--profile with --profile-dir): each stage's measured pipeline bubble, the
// per-rank Chrome traces and their merge (train_loop.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "megatron/trainer/train_loop.h"
#include "megatron/train/logging_arguments.h"

namespace megatron::trainer {

namespace {

// The bubble of each recorded iteration on this rank: time in the schedule (which, while profiling, lasts until
// every stage has finished) not spent in a forward or backward, over the time spent in them (Megatron's
// definition, whose ideal is (p - 1) / (v * m) on every stage); the mean over iterations.
double measured_bubble(const std::vector<TimelineSpan>& spans) {
  std::map<int64_t, std::pair<double, double>> per_iteration;  // (schedule wall, compute)
  for (const TimelineSpan& s : spans) {
    if (s.category == "schedule") per_iteration[s.iteration].first += s.duration_us;
    if (s.category == "compute") per_iteration[s.iteration].second += s.duration_us;
  }
  double sum = 0;
  int n = 0;
  for (const auto& [it, wall_compute] : per_iteration)
    if (wall_compute.second > 0) sum += (wall_compute.first - wall_compute.second) / wall_compute.second, ++n;
  return n ? sum / n : 0.0;
}

// Rank 0 concatenates the per-rank traces into one (the ranks share a filesystem, as for checkpoints).
void merge_traces(const std::filesystem::path& dir, int world_size) {
  std::string merged = "[\n";
  bool first = true;
  for (int r = 0; r < world_size; ++r) {
    std::ifstream f(dir / str_cat("trace_rank_", r, ".json"));
    if (!f) continue;
    std::string text((std::istreambuf_iterator<char>(f)), {});
    const size_t open = text.find('['), close = text.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close <= open + 1) continue;
    merged += (first ? "" : ",\n") + text.substr(open + 1, close - open - 1);
    first = false;
  }
  std::ofstream(dir / "trace.json") << merged << "\n]\n";
}

// With --use-pytorch-profiler: how busy the GPU was in each recorded iteration, and where the time of the last
// one went by kernel (what an idle or slow step is made of, under the clocks the run had).
void print_gpu_activity(const Timeline& timeline, int rank) {
  if (!timeline.records_gpu_activity() || timeline.gpu_summaries().empty()) return;
  for (const auto& [iteration, g] : timeline.gpu_summaries())
    std::printf("rank %d iteration %lld: GPU busy %.1f%% of %.1f ms (%lld kernels, %lld copies/memsets; idle "
                "%.1f ms, longest idle stretch %.3f ms)\n",
                rank, static_cast<long long>(iteration), 100.0 * g.busy_fraction(), g.window_us / 1e3,
                static_cast<long long>(g.kernels), static_cast<long long>(g.copies), (g.window_us - g.busy_us) / 1e3,
                g.longest_gap_us / 1e3);
  const auto& [iteration, last] = timeline.gpu_summaries().back();
  std::printf("rank %d iteration %lld by kernel (ms; share of the busy time):\n", rank,
              static_cast<long long>(iteration));
  for (size_t i = 0; i < last.by_name.size() && i < 25; ++i) {
    const GpuTimeByName& k = last.by_name[i];
    std::printf("  %9.3f %5.1f%% %6lld x %s\n", k.total_us / 1e3, last.busy_us > 0 ? 100.0 * k.total_us / last.busy_us : 0.0,
                static_cast<long long>(k.launches), k.name.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

bool TrainLoop::profiled_rank() const {
  const std::vector<int>& ranks = args_.training.profile_ranks;
  return ranks.empty() ? world_.rank() == 0 : std::find(ranks.begin(), ranks.end(), world_.rank()) != ranks.end();
}

void TrainLoop::report_profile() {
  const train::TrainingArguments& t = args_.training;
  const parallel::ParallelContext& pc = trainer_.parallel();
  const int pp = pc.pp_size(), stage = pc.pp().rank();
  // One value per stage: its first rank's (tensor and data ranks of a stage run the same schedule).
  std::vector<double> bubbles(size_t(pp), 0.0);
  if (pc.tp().rank() == 0 && pc.dp().rank() == 0) bubbles[size_t(stage)] = measured_bubble(timeline_->spans());
  world_.all_reduce_host(bubbles, comm::ReduceOp::Sum);
  const std::filesystem::path dir(train::profile_trace_dir(args_));
  if (profiled_rank()) {
    std::filesystem::create_directories(dir);
    std::ofstream out(dir / str_cat("trace_rank_", world_.rank(), ".json"));
    out << timeline_->chrome_trace(world_.rank(), str_cat("rank ", world_.rank(), " (pp ", stage, ", tp ", pc.tp().rank(),
                                                          ", dp ", pc.dp().rank(), ")"));
    MEGATRON_CHECK(out.good(), "--profile-dir: cannot write ", (dir / str_cat("trace_rank_", world_.rank(), ".json")).string());
  }
  if (profiled_rank()) print_gpu_activity(*timeline_, world_.rank());
  world_.barrier();
  if (world_.rank() != 0) return;
  merge_traces(dir, world_.size());
  const int v = args_.parallel.virtual_pipeline_size, m = args_.num_micro_batches();
  std::cout << "pipeline bubble per stage over iterations " << t.profile_step_start << "-"
            << std::min(t.profile_step_end - 1, t.train_iters) << " (time from the schedule's start until every stage "
            << "has finished, outside forward/backward, over forward/backward time):";
  for (int s = 0; s < pp; ++s) std::printf(" stage %d %.3f", s, bubbles[size_t(s)]);
  std::printf(" | ideal (p-1)/(v*m) = (%d-1)/(%d*%d) = %.3f\n", pp, v, m, double(pp - 1) / (double(v) * m));
  std::cout << "timeline (Chrome trace; chrome://tracing or ui.perfetto.dev): " << (dir / "trace.json").string() << "\n"
            << std::flush;
}

}  // namespace megatron::trainer
