#include "megatron/trainer/train_loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "megatron/train/flops.h"
#include "megatron/train/log_line.h"
#include "megatron/train/logging_arguments.h"
#include "megatron/trainer/finite_check.h"
#include "megatron/trainer/timer_report.h"

namespace megatron::trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double gib(double bytes) { return bytes / double(1ull << 30); }

int timer_level(const train::Arguments& args) {
  return std::max(args.logging.timing_log_level, args.logging.log_straggler ? 2 : 0);
}

}  // namespace

TrainLoop::TrainLoop(Context& ctx, const train::Arguments& args, Trainer& trainer, RunCheckpoints& checkpoints,
                     RunStreams& streams, comm::Communicator& world)
    : ctx_(ctx), args_(args), trainer_(trainer), checkpoints_(checkpoints), streams_(streams), world_(world),
      last_rank_(world.rank() == world.size() - 1), timers_(ctx, timer_level(args)), checkpoint_timers_(ctx, 0) {
  if (!train::profile_trace_dir(args).empty()) {
    timeline_ = std::make_unique<Timeline>(ctx);
    trainer_.set_timeline(timeline_.get());
    ctx.set_timeline(timeline_.get());
    if (args.training.use_pytorch_profiler && profiled_rank()) {
      if (ctx.is_cuda()) timeline_->record_gpu_activity();  // refused with the reason in builds without CUPTI
      else std::cout << "--use-pytorch-profiler: this rank runs on the CPU, where every op completes inside its "
                        "call; its trace holds the host spans only\n";
    }
  }
  if (timers_.log_level() > 0) trainer_.set_timers(&timers_);
  tensorboard_ = TensorBoardLog::open(args, last_rank_);
  if (tensorboard_) std::cout << "TensorBoard event file: " << tensorboard_->path() << "\n";
  if (args.logging.log_straggler)
    straggler_ = std::make_unique<StragglerDetector>(trainer.parallel(), args.logging.straggler_minmax_count);
  if (args.logging.exit_signal_handler)
    exit_signal_ = std::make_unique<ExitSignalHandler>(train::exit_signal_number(args.logging.exit_signal));
}

TrainLoop::~TrainLoop() {
  trainer_.set_timeline(nullptr);
  if (timeline_) ctx_.set_timeline(nullptr);
  trainer_.set_timers(nullptr);
}

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
    timers_.collect();  // the device timers' events have completed: the synchronisation above
    if (timeline_ && timeline_->recording()) timeline_->collect();
    if (profiling(iteration) && (iteration + 1 == t.profile_step_end || iteration == t.train_iters)) report_profile();
    log(iteration, r, seconds);
    if (t.eval_iters > 0 && t.eval_interval > 0 && iteration % t.eval_interval == 0 && streams_.valid.available())
      evaluate_validation(iteration);
    checkpoints_.poll();
    if (args_.checkpoint.save_interval > 0 && iteration % args_.checkpoint.save_interval == 0) save_checkpoint(iteration);
    if (should_exit(iteration)) break;
  }
  // A run that stops (end, --exit-interval, --exit-duration-in-mins, --exit-signal-handler) saves, as Megatron
  // does; an asynchronous save finishes (and reports its errors) before the run ends.
  if (last > start_iteration) save_checkpoint(last);
  checkpoints_.finish();
  if (t.eval_iters > 0 && streams_.test.available()) {
    const std::string where = str_cat("iteration ", last, " on test set");
    const double loss = trainer_.evaluate(streams_.test);
    print_evaluation(where, loss);
    if (!t.no_check_for_nan_in_loss_and_grad) check_finite_evaluation(where, loss);
  }
  if (tensorboard_) tensorboard_->flush();
  return last;
}

void TrainLoop::save_checkpoint(int64_t iteration) {
  if (args_.checkpoint.save.empty()) {
    checkpoints_.save(iteration, streams_.train, streams_.valid);  // nothing to write: keeps RunCheckpoints' rules
    return;
  }
  checkpoint_timers_.start("save-checkpoint", 0, TimerClock::Host);
  checkpoints_.save(iteration, streams_.train, streams_.valid);
  checkpoint_timers_.stop("save-checkpoint");
  const TimerReport report =
      report_timers(checkpoint_timers_, world_, {"save-checkpoint"}, args_.logging.timing_log_option, 1.0);
  if (last_rank_ && !report.text.empty()) std::cout << report.text << "\n" << std::flush;
  checkpoint_timers_.reset();
}

// Megatron saves a checkpoint before the first iteration whose number of micro-batches differs from the
// previous one's (a batch-size ramp-up or step schedule), so that a run can restart at the new size.
void TrainLoop::save_when_batch_grows(int64_t iteration, int64_t& batch) {
  const int64_t next = trainer_.global_batch_size(streams_.train.consumed());
  const int64_t done = iteration - 1, interval = args_.checkpoint.save_interval;
  if (next != batch && done > 0 && !args_.checkpoint.save.empty() && (interval <= 0 || done % interval != 0)) {
    if (last_rank_) std::cout << "global batch size changes from " << batch << " to " << next << ": saving\n";
    save_checkpoint(done);
  }
  batch = next;
}

bool TrainLoop::log_iteration(int64_t iteration) const {
  return iteration % args_.training.log_interval == 0 || iteration == args_.training.train_iters;
}

void TrainLoop::log(int64_t iteration, const StepResult& r, double seconds) {
  interval_loss_ += r.loss;
  interval_seconds_ += seconds;
  interval_document_squares_ += r.document_squares;
  ++interval_iters_;
  skipped_ += r.skipped;
  nans_ += r.nan_loss;
  if (r.grad_norm) last_grad_norm_ = r.grad_norm;
  // The diagnostics are collectives: every rank decides from the same flags and iteration.
  const train::LoggingArguments& l = args_.logging;
  const bool tensorboard_step = !l.tensorboard_dir.empty() && iteration % l.tensorboard_log_interval == 0;
  const bool needed = log_iteration(iteration) || tensorboard_step;
  num_zeros_ = l.log_num_zeros_in_grad && needed ? std::optional(trainer_.num_zeros_in_grads()) : std::nullopt;
  params_norm_ = l.log_params_norm && needed ? std::optional(trainer_.params_norm()) : std::nullopt;
  write_tensorboard(iteration, r);
  if (!log_iteration(iteration)) return;

  print_log_line(iteration, r);
  report_interval(iteration, interval_seconds_ / double(interval_iters_), r.global_batch_size);
  interval_loss_ = interval_seconds_ = interval_document_squares_ = 0;
  interval_iters_ = skipped_ = nans_ = 0;
  interval_moe_losses_.clear();
  interval_moe_layer_losses_.clear();
  print_memory_once(iteration);
  if (tensorboard_) tensorboard_->flush();
}

// Megatron's per-iteration TensorBoard scalars; an MoE model's losses are read every iteration here (they
// are also what the log line averages over the interval).
void TrainLoop::write_tensorboard(int64_t iteration, const StepResult& r) {
  const train::LoggingArguments& l = args_.logging;
  if (l.tensorboard_dir.empty()) return;
  std::vector<std::pair<std::string, double>> per_layer;
  const auto moe = trainer_.moe_losses(1, args_.moe.moe_per_layer_logging ? &per_layer : nullptr);
  for (size_t i = 0; i < moe.size(); ++i) {
    if (interval_moe_losses_.size() < moe.size()) interval_moe_losses_.emplace_back(moe[i].first, 0.0);
    interval_moe_losses_[i].second += moe[i].second;
  }
  for (size_t i = 0; i < per_layer.size(); ++i) {
    if (interval_moe_layer_losses_.size() < per_layer.size())
      interval_moe_layer_losses_.emplace_back(per_layer[i].first, 0.0);
    interval_moe_layer_losses_[i].second += per_layer[i].second;
  }
  if (!tensorboard_) return;
  if (!moe.empty()) tensorboard_->moe_losses(iteration, moe, per_layer);
  if (iteration % l.tensorboard_log_interval != 0) return;
  IterationScalars s{.iteration = iteration,
                     .consumed_samples = streams_.train.consumed(),
                     .batch_size = r.global_batch_size,
                     .learning_rate = trainer_.scheduler().lr(),
                     .lm_loss = r.loss,
                     .loss_scale = trainer_.loss_scaler() ? trainer_.loss_scaler()->scale() : 1.0,
                     .grad_norm = r.grad_norm,
                     .params_norm = params_norm_,
                     .num_zeros = num_zeros_};
  if (l.log_memory_to_tensorboard) s.memory = ctx_.allocator().stats();
  tensorboard_->iteration(s);
}

void TrainLoop::print_log_line(int64_t iteration, const StepResult& r) {
  const double per_iter = interval_seconds_ / double(interval_iters_);
  train::IterationLog line;
  line.iteration = iteration;
  line.train_iters = args_.training.train_iters;
  line.consumed_samples = streams_.train.consumed();
  line.seconds_per_iteration = per_iter;
  line.tflops_per_gpu = train::tflops_per_gpu(args_, r.global_batch_size, per_iter,
                                              interval_document_squares_ / double(interval_iters_));
  line.tokens_per_second_per_gpu =
      double(r.global_batch_size) * args_.model.seq_length / per_iter / double(world_.size());
  // Megatron logs the optimizer's learning rate after the iteration's scheduler step: the one the next
  // iteration uses (StepResult::learning_rate is the one this iteration used).
  line.learning_rate = trainer_.scheduler().lr();
  line.global_batch_size = r.global_batch_size;
  line.lm_loss = interval_loss_ / double(interval_iters_);
  std::vector<std::pair<std::string, double>> per_layer;  // --moe-per-layer-logging
  if (args_.logging.tensorboard_dir.empty()) {
    line.extra_losses = trainer_.moe_losses(interval_iters_, args_.moe.moe_per_layer_logging ? &per_layer : nullptr);
  } else {  // read every iteration for TensorBoard: their mean over the interval
    line.extra_losses = interval_moe_losses_;
    per_layer = interval_moe_layer_losses_;
    for (auto& [name, value] : line.extra_losses) value /= double(interval_iters_);
    for (auto& [name, value] : per_layer) value /= double(interval_iters_);
  }
  line.loss_scale = trainer_.loss_scaler() ? trainer_.loss_scaler()->scale() : 1.0;
  line.grad_norm = last_grad_norm_;
  line.num_zeros = num_zeros_;
  line.params_norm = params_norm_;
  line.skipped_iterations = skipped_;
  line.nan_iterations = nans_;
  if (last_rank_) std::cout << train::format_log_line(line) << "\n" << train::format_moe_per_layer(per_layer) << std::flush;
}

void TrainLoop::report_interval(int64_t iteration, double seconds_per_iteration, int64_t global_batch_size) {
  const double iterations = double(interval_iters_);
  const std::optional<double> tflops = train::tflops_per_gpu(args_, global_batch_size, seconds_per_iteration,
                                                             interval_document_squares_ / iterations);
  TimerReport timers;
  if (args_.logging.timing_log_level > 0) {
    timers = report_timers(timers_, world_, megatron_timer_names(args_.logging.timing_log_level),
                           args_.logging.timing_log_option, iterations);
    if (last_rank_ && !timers.text.empty()) std::cout << timers.text << "\n" << std::flush;
  }
  if (straggler_) {
    const double data = timers_.elapsed_seconds("batch-generator");
    const double compute = timers_.elapsed_seconds("forward-compute") + timers_.elapsed_seconds("backward-compute");
    // A rank's share of the model's FLOPs per iteration, in TFLOP (TFLOP/s per GPU x seconds per iteration).
    const double tflop_per_rank = tflops.value_or(0.0) * seconds_per_iteration;
    const StragglerReport s = straggler_->report(data, compute, iterations, tflop_per_rank, iteration);
    if (!s.text.empty()) std::cout << s.text << std::flush;
    if (tensorboard_)
      tensorboard_->straggler(iteration, s.slowest_tflops, s.slowest_rank, s.fastest_tflops, s.fastest_rank);
  }
  if (tensorboard_) tensorboard_->interval(iteration, seconds_per_iteration, tflops, timers.max_seconds);
  timers_.reset();
}

void TrainLoop::print_memory_once(int64_t iteration) {
  if (printed_memory_) return;
  const AllocatorStats s = ctx_.allocator().stats();
  const double peak = double(s.peak_allocated_bytes), state = double(model_state_bytes_);
  std::cout << (world_.size() > 1 ? str_cat("[rank ", world_.rank(), "] ") : std::string()) << "[after iteration "
            << iteration << "] memory (GiB): peak allocated " << gib(peak) << " | peak reserved "
            << gib(double(s.peak_reserved_bytes)) << " | model state " << gib(state)
            << " | peak activations (peak allocated - model state) " << gib(peak - state) << "\n";
  // Megatron's report_memory, from each data-parallel group's rank 0.
  if (trainer_.parallel().dp().rank() == 0) {
    const double mb = 1024.0 * 1024.0;
    char line[320];
    std::snprintf(line, sizeof line,
                  "[Rank %d] (after %lld iterations) memory (MB) | allocated: %.2f | max allocated: %.2f | "
                  "reserved: %.2f | max reserved: %.2f",
                  world_.rank(), static_cast<long long>(iteration), double(s.allocated_bytes) / mb, peak / mb,
                  double(s.reserved_bytes) / mb, double(s.peak_reserved_bytes) / mb);
    std::cout << line << "\n";
  }
  std::cout << std::flush;
  printed_memory_ = true;
}

void TrainLoop::evaluate_validation(int64_t iteration) {
  const double loss = trainer_.evaluate(streams_.valid);
  print_evaluation(str_cat("iteration ", iteration), loss);
  if (tensorboard_) tensorboard_->validation(iteration, streams_.train.consumed(), loss);
  if (!args_.training.no_check_for_nan_in_loss_and_grad)
    check_finite_evaluation(str_cat("iteration ", iteration), loss);
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

// The exit conditions after `iteration`; the time and the signal are agreed over the ranks in one all-reduce
// (only when asked for: a collective per iteration).
bool TrainLoop::should_exit(int64_t iteration) {
  const train::TrainingArguments& t = args_.training;
  if (t.exit_interval > 0 && iteration % t.exit_interval == 0) {
    if (last_rank_) std::cout << "exiting at iteration " << iteration << " (--exit-interval " << t.exit_interval << ")\n";
    return true;
  }
  if (t.exit_duration_in_mins <= 0 && !exit_signal_) return false;
  double agreed[2] = {seconds_since(start_) / 60, exit_signal_ && exit_signal_->received() ? 1.0 : 0.0};
  world_.all_reduce_host(agreed, comm::ReduceOp::Max);  // every rank stops at the same iteration
  if (agreed[1] != 0.0) {
    const std::string name = exit_signal_->received_name();
    if (last_rank_)
      std::cout << "exiting at iteration " << iteration << " after receiving "
                << (name.empty() ? "the exit signal on another rank" : name) << " (--exit-signal-handler)"
                << (args_.checkpoint.save.empty() ? "" : ": saving a checkpoint") << "\n" << std::flush;
    return true;
  }
  if (t.exit_duration_in_mins <= 0 || agreed[0] < t.exit_duration_in_mins) return false;
  if (last_rank_)
    std::cout << "exiting at iteration " << iteration << " after " << agreed[0] << " minutes (--exit-duration-in-mins)\n";
  return true;
}

}  // namespace megatron::trainer
