#include "megatron/trainer/tensorboard_log.h"

#include <cmath>

#include "megatron/core/error.h"

#if MEGATRON_WITH_TENSORBOARD
#include "megatron/tensorboard/event_file_writer.h"
#endif

namespace megatron::trainer {

#if MEGATRON_WITH_TENSORBOARD
struct TensorBoardLog::Writer {
  tensorboard::EventFileWriter file;
  Writer(const std::string& dir, int queue_size) : file(dir, queue_size) {}
};
#else
struct TensorBoardLog::Writer {};
#endif

std::unique_ptr<TensorBoardLog> TensorBoardLog::open(const train::Arguments& args, bool last_rank) {
  const train::LoggingArguments& l = args.logging;
  if (l.tensorboard_dir.empty() || !last_rank) return nullptr;
#if MEGATRON_WITH_TENSORBOARD
  return std::unique_ptr<TensorBoardLog>(
      new TensorBoardLog(args, std::make_unique<Writer>(l.tensorboard_dir, l.tensorboard_queue_size)));
#else
  MEGATRON_FAIL("--tensorboard-dir ", l.tensorboard_dir, ": this build writes no TensorBoard event files (install ",
                "libprotobuf-dev and protobuf-compiler, then reconfigure)");
#endif
}

TensorBoardLog::TensorBoardLog(const train::Arguments& args, std::unique_ptr<Writer> writer)
    : args_(args), writer_(std::move(writer)) {}

TensorBoardLog::~TensorBoardLog() = default;

void TensorBoardLog::scalar(const std::string& tag, double value, int64_t step) {
#if MEGATRON_WITH_TENSORBOARD
  writer_->file.add_scalar(tag, value, step);
#endif
}

void TensorBoardLog::flush() {
#if MEGATRON_WITH_TENSORBOARD
  writer_->file.flush();
#endif
}

std::string TensorBoardLog::path() const {
#if MEGATRON_WITH_TENSORBOARD
  return writer_->file.path().string();
#else
  return "";
#endif
}

void TensorBoardLog::iteration(const IterationScalars& s) {
  const train::LoggingArguments& l = args_.logging;
  const int64_t it = s.iteration, samples = s.consumed_samples;
  auto both = [&](const std::string& tag, double value) {
    scalar(tag, value, it);
    scalar(tag + " vs samples", value, samples);
  };
  both("learning-rate", s.learning_rate);
  both("batch-size", double(s.batch_size));
  both("lm loss", s.lm_loss);
  if (!l.no_log_loss_scale_to_tensorboard) both("loss-scale", s.loss_scale);
  if (l.log_world_size_to_tensorboard) both("world-size", double(args_.parallel.world_size));
  if (s.grad_norm) both("grad-norm", *s.grad_norm);
  if (s.num_zeros) both("num-zeros", double(*s.num_zeros));
  if (s.params_norm) both("params-norm", *s.params_norm);
  if (l.log_memory_to_tensorboard && s.memory) {
    scalar("mem-reserved-bytes", double(s.memory->reserved_bytes), it);
    scalar("mem-allocated-bytes", double(s.memory->allocated_bytes), it);
    scalar("mem-max-allocated-bytes", double(s.memory->peak_allocated_bytes), it);
  }
}

void TensorBoardLog::moe_losses(int64_t iteration, const std::vector<std::pair<std::string, double>>& averaged,
                                const std::vector<std::pair<std::string, double>>& per_layer) {
  for (const auto& [name, value] : averaged) scalar(name, value, iteration);
  for (const auto& [name, value] : per_layer) scalar(name, value, iteration);
}

void TensorBoardLog::interval(int64_t iteration, double seconds_per_iteration, std::optional<double> tflops_per_gpu,
                              const std::vector<std::pair<std::string, double>>& timer_max_seconds) {
  const train::LoggingArguments& l = args_.logging;
  if (!l.log_timers_to_tensorboard) return;
  scalar("iteration-time", seconds_per_iteration, iteration);
  if (l.log_throughput && tflops_per_gpu) scalar("throughput", *tflops_per_gpu, iteration);
  for (const auto& [name, seconds] : timer_max_seconds) scalar(name + "-time", seconds, iteration);
}

void TensorBoardLog::validation(int64_t iteration, int64_t consumed_samples, double loss) {
  scalar("lm loss validation", loss, iteration);
  scalar("lm loss validation vs samples", loss, consumed_samples);
  if (!args_.logging.log_validation_ppl_to_tensorboard) return;
  const double ppl = std::exp(std::min(20.0, loss));
  scalar("lm loss validation ppl", ppl, iteration);
  scalar("lm loss validation ppl vs samples", ppl, consumed_samples);
}

void TensorBoardLog::straggler(int64_t iteration, double slowest_tflops, int slowest_rank, double fastest_tflops,
                               int fastest_rank) {
  scalar("straggler/min-throughput", slowest_tflops, iteration);
  scalar("straggler/min-throughput-rank", double(slowest_rank), iteration);
  scalar("straggler/max-throughput", fastest_tflops, iteration);
  scalar("straggler/max-throughput-rank", double(fastest_rank), iteration);
}

}  // namespace megatron::trainer
