#include "megatron/trainer/train_loop.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "megatron/train/flops.h"
#include "megatron/train/log_line.h"

namespace megatron::trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double gib(double bytes) { return bytes / double(1ull << 30); }

}  // namespace

TrainLoop::TrainLoop(Context& ctx, const train::Arguments& args, Trainer& trainer, RunCheckpoints& checkpoints,
                     RunStreams& streams, comm::Communicator& world)
    : ctx_(ctx), args_(args), trainer_(trainer), checkpoints_(checkpoints), streams_(streams), world_(world),
      last_rank_(world.rank() == world.size() - 1) {
  if (args.training.profile && !args.training.profile_dir.empty()) {
    timeline_ = std::make_unique<Timeline>(ctx);
    trainer_.set_timeline(timeline_.get());
  }
}

TrainLoop::~TrainLoop() { trainer_.set_timeline(nullptr); }

bool TrainLoop::profiling(int64_t iteration) const {
  const train::TrainingArguments& t = args_.training;
  return timeline_ && iteration >= t.profile_step_start && iteration < t.profile_step_end;
}

int64_t TrainLoop::run(int64_t start_iteration) {
  const train::TrainingArguments& t = args_.training;
  int64_t last = start_iteration;
  start_ = std::chrono::steady_clock::now();
  ctx_.synchronize();
  model_state_bytes_ = ctx_.allocator().stats().allocated_bytes;
  ctx_.allocator().reset_peak_stats();  // the peak reported is the training steps' (not init's transients)
  int64_t batch = trainer_.global_batch_size(streams_.train.consumed());
  for (int64_t iteration = start_iteration + 1; iteration <= t.train_iters; ++iteration) {
    last = iteration;
    save_when_batch_grows(iteration, batch);
    // The external profiler's window (Nsight Systems / Compute with capture ranges): GPU runs only.
    if (t.profile && ctx_.is_cuda() && iteration == t.profile_step_start) cuda_profiler_start();
    if (t.profile && ctx_.is_cuda() && iteration == t.profile_step_end) cuda_profiler_stop();
    if (profiling(iteration)) timeline_->begin_iteration(iteration);
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = trainer_.train_step(streams_.train, iteration);
    ctx_.synchronize();
    const double seconds = seconds_since(t0);
    if (timeline_ && timeline_->recording()) timeline_->collect();
    if (profiling(iteration) && (iteration + 1 == t.profile_step_end || iteration == t.train_iters)) report_profile();
    log(iteration, r, seconds);
    if (t.eval_iters > 0 && t.eval_interval > 0 && iteration % t.eval_interval == 0 && streams_.valid.available())
      print_evaluation(str_cat("iteration ", iteration), trainer_.evaluate(streams_.valid));
    checkpoints_.poll();
    if (args_.checkpoint.save_interval > 0 && iteration % args_.checkpoint.save_interval == 0)
      checkpoints_.save(iteration, streams_.train, streams_.valid);
    if (should_exit(iteration)) break;
  }
  // A run that stops (end, --exit-interval, --exit-duration-in-mins) saves, as Megatron does; an asynchronous
  // save finishes (and reports its errors) before the run ends.
  if (last > start_iteration) checkpoints_.save(last, streams_.train, streams_.valid);
  checkpoints_.finish();
  if (t.eval_iters > 0 && streams_.test.available())
    print_evaluation(str_cat("iteration ", last, " on test set"), trainer_.evaluate(streams_.test));
  return last;
}

// Megatron saves a checkpoint before the first iteration whose number of micro-batches differs from the
// previous one's (a batch-size ramp-up or step schedule), so that a run can restart at the new size.
void TrainLoop::save_when_batch_grows(int64_t iteration, int64_t& batch) {
  const int64_t next = trainer_.global_batch_size(streams_.train.consumed());
  const int64_t done = iteration - 1, interval = args_.checkpoint.save_interval;
  if (next != batch && done > 0 && !args_.checkpoint.save.empty() && (interval <= 0 || done % interval != 0)) {
    if (last_rank_) std::cout << "global batch size changes from " << batch << " to " << next << ": saving\n";
    checkpoints_.save(done, streams_.train, streams_.valid);
  }
  batch = next;
}

void TrainLoop::log(int64_t iteration, const StepResult& r, double seconds) {
  const train::TrainingArguments& t = args_.training;
  interval_loss_ += r.loss;
  interval_seconds_ += seconds;
  ++interval_iters_;
  skipped_ += r.skipped;
  nans_ += r.nan_loss;
  if (r.grad_norm) last_grad_norm_ = r.grad_norm;
  if (iteration % t.log_interval != 0 && iteration != t.train_iters) return;

  const double per_iter = interval_seconds_ / double(interval_iters_);
  train::IterationLog line;
  line.iteration = iteration;
  line.train_iters = t.train_iters;
  line.consumed_samples = streams_.train.consumed();
  line.seconds_per_iteration = per_iter;
  line.tflops_per_gpu = train::tflops_per_gpu(args_, r.global_batch_size, per_iter);
  line.tokens_per_second_per_gpu =
      double(r.global_batch_size) * args_.model.seq_length / per_iter / double(world_.size());
  line.learning_rate = r.learning_rate;
  line.global_batch_size = r.global_batch_size;
  line.lm_loss = interval_loss_ / double(interval_iters_);
  line.extra_losses = trainer_.moe_losses(interval_iters_);
  line.loss_scale = trainer_.loss_scaler() ? trainer_.loss_scaler()->scale() : 1.0;
  line.grad_norm = last_grad_norm_;
  line.skipped_iterations = skipped_;
  line.nan_iterations = nans_;
  if (last_rank_) std::cout << train::format_log_line(line) << "\n" << std::flush;
  interval_loss_ = interval_seconds_ = 0;
  interval_iters_ = skipped_ = nans_ = 0;
  print_memory_once(iteration);
}

void TrainLoop::print_memory_once(int64_t iteration) {
  if (printed_memory_) return;
  const AllocatorStats s = ctx_.allocator().stats();
  const double peak = double(s.peak_allocated_bytes), state = double(model_state_bytes_);
  std::cout << (world_.size() > 1 ? str_cat("[rank ", world_.rank(), "] ") : std::string()) << "[after iteration "
            << iteration << "] memory (GiB): peak allocated " << gib(peak) << " | peak reserved "
            << gib(double(s.peak_reserved_bytes)) << " | model state " << gib(state)
            << " | peak activations (peak allocated - model state) " << gib(peak - state) << "\n";
  printed_memory_ = true;
}

// Megatron's evaluation block: the loss and its perplexity between two rules.
void TrainLoop::print_evaluation(const std::string& where, double loss) const {
  if (!last_rank_) return;
  const std::string line = str_cat(" validation loss at ", where, " | lm loss value: ");
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.6E | lm loss PPL: %.6E | ", loss, std::exp(std::min(20.0, loss)));
  const std::string rule(line.size() + std::string(buf).size(), '-');
  std::cout << rule << "\n" << line << buf << "\n" << rule << "\n" << std::flush;
}

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

}  // namespace

void TrainLoop::report_profile() {
  const train::TrainingArguments& t = args_.training;
  const parallel::ParallelContext& pc = trainer_.parallel();
  const int pp = pc.pp_size(), stage = pc.pp().rank();
  // One value per stage: its first rank's (tensor and data ranks of a stage run the same schedule).
  std::vector<double> bubbles(size_t(pp), 0.0);
  if (pc.tp().rank() == 0 && pc.dp().rank() == 0) bubbles[size_t(stage)] = measured_bubble(timeline_->spans());
  world_.all_reduce_host(bubbles, comm::ReduceOp::Sum);
  const std::vector<int> ranks = t.profile_ranks.empty() ? std::vector<int>{0} : t.profile_ranks;
  const std::filesystem::path dir(t.profile_dir);
  if (std::find(ranks.begin(), ranks.end(), world_.rank()) != ranks.end()) {
    std::filesystem::create_directories(dir);
    std::ofstream out(dir / str_cat("trace_rank_", world_.rank(), ".json"));
    out << timeline_->chrome_trace(world_.rank(), str_cat("rank ", world_.rank(), " (pp ", stage, ", tp ", pc.tp().rank(),
                                                          ", dp ", pc.dp().rank(), ")"));
    MEGATRON_CHECK(out.good(), "--profile-dir: cannot write ", (dir / str_cat("trace_rank_", world_.rank(), ".json")).string());
  }
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

bool TrainLoop::should_exit(int64_t iteration) {
  const train::TrainingArguments& t = args_.training;
  if (t.exit_interval > 0 && iteration % t.exit_interval == 0) {
    if (last_rank_) std::cout << "exiting at iteration " << iteration << " (--exit-interval " << t.exit_interval << ")\n";
    return true;
  }
  if (t.exit_duration_in_mins <= 0) return false;
  double minutes[1] = {seconds_since(start_) / 60};
  world_.all_reduce_host(minutes, comm::ReduceOp::Max);  // every rank stops at the same iteration
  if (minutes[0] < t.exit_duration_in_mins) return false;
  if (last_rank_)
    std::cout << "exiting at iteration " << iteration << " after " << minutes[0] << " minutes (--exit-duration-in-mins)\n";
  return true;
}

}  // namespace megatron::trainer
