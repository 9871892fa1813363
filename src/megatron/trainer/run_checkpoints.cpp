#include "megatron/trainer/run_checkpoints.h"

#include <chrono>
#include <filesystem>
#include <iostream>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/checkpoint_verify.h"

namespace megatron::trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RunCheckpoints::RunCheckpoints(Context& ctx, const train::Arguments& args, comm::Communicator& world)
    : ctx_(ctx), args_(args), world_(world), reports_(world.rank() == 0), async_saver_(&world) {
  const std::string& load = args.checkpoint.load;
  if (load.empty()) return;
  const std::filesystem::path root = checkpoint::checkpoint_to_load(load, args.checkpoint.ckpt_step);
  const bool fallback = args.checkpoint.load_fallback_to_intact;
  if (!std::filesystem::exists(root / checkpoint::kTrackerFile) &&
      !std::filesystem::exists(root / checkpoint::kMetadataFile) &&
      !(fallback && !checkpoint::saved_iterations(root).empty())) {
    std::cout << "WARNING: no checkpoint found in --load " << load << "; training from scratch\n";
    return;
  }
  const std::filesystem::path chosen = fallback ? intact_checkpoint(root) : root;
  try {
    preview_ = checkpoint::preview_checkpoint(chosen);
  } catch (const Error& e) {
    std::optional<int64_t> named;
    try {
      if (auto latest = checkpoint::read_latest_checkpoint(root); latest && !latest->release) named = latest->iteration;
    } catch (const Error&) {  // a tracker that does not read: every checkpoint is a candidate
    }
    throw Error(str_cat(e.what(), "\n", checkpoint::intact_checkpoint_hint(root, named)));
  }
}

std::filesystem::path RunCheckpoints::intact_checkpoint(const std::filesystem::path& root) {
  if (std::filesystem::exists(root / checkpoint::kMetadataFile)) return root;  // an iteration directory itself
  std::optional<checkpoint::LatestCheckpoint> named;
  try {
    named = checkpoint::read_latest_checkpoint(root);
  } catch (const Error& e) {
    if (reports_) std::cout << "WARNING: " << e.what() << "\n";
  }
  std::optional<int64_t> below;
  if (named) {
    std::vector<std::string> problems;
    if (checkpoint::checkpoint_is_intact(named->dir, &world_, &problems)) return named->dir;
    for (const std::string& p : problems)
      std::cout << (world_.size() > 1 ? str_cat("[rank ", world_.rank(), "] ") : std::string()) << "WARNING: " << p << "\n";
    MEGATRON_CHECK(!named->release, "--load-fallback-to-intact: the release checkpoint ", named->dir.string(),
                   " is not intact (see above); there is no older checkpoint to fall back to");
    below = named->iteration;
  }
  const std::optional<checkpoint::IntactCheckpoint> intact = checkpoint::newest_intact_checkpoint(root, below, &world_);
  MEGATRON_CHECK(intact.has_value(), "--load-fallback-to-intact: no intact checkpoint in ", root.string(),
                 below ? str_cat(" older than iteration ", *below) : std::string(), " (see the warnings above)");
  if (reports_)
    std::cout << "WARNING: --load-fallback-to-intact: "
              << (named ? named->dir.string() + " is not intact" : std::string("the tracker names no checkpoint"))
              << "; resuming from the newest intact checkpoint, " << intact->dir.string() << " (iteration "
              << intact->iteration << ")\n" << std::flush;
  return intact->dir;
}

uint64_t RunCheckpoints::model_seed() const {
  const bool weights_only = args_.checkpoint.finetune || (preview_ && preview_->release);
  if (preview_ && preview_->seed && !args_.checkpoint.no_load_rng && !weights_only) return *preview_->seed;
  return uint64_t(args_.training.seed);
}

void RunCheckpoints::attach(std::vector<nn::GPTModel*> chunks, Trainer& trainer) {
  trainer_ = &trainer;
  const optim::DistributedOptimizer* dist = trainer.distributed_optimizer();
  state_ = checkpoint::TrainingState{
      .model = std::move(chunks),
      .optimizer = &trainer.optimizer(),
      .optimizer_ranges = dist ? dist->param_ranges() : std::vector<optim::DistributedOptimizer::ParamRange>{},
      // The ranks holding the same parameters (and sharing the distributed optimizer's shards): DP x CP.
      .dp_rank = trainer.parallel().dp_cp().rank(),
      .dp_size = trainer.parallel().dp_cp().size(),
      // Expert parameters: the ranks holding the same experts (and sharing their optimizer shards): expert-DP.
      .expert_dp_rank = trainer.parallel().expert_dp().rank(),
      .expert_dp_size = trainer.parallel().expert_dp().size(),
      .scheduler = &trainer.mutable_scheduler(),
      .scaler = trainer.mutable_loss_scaler(),
      .args = &args_};
}

std::pair<double, double> RunCheckpoints::totals(double bytes, double seconds) {
  double sum[1] = {bytes}, max[1] = {seconds};
  world_.all_reduce_host(sum, comm::ReduceOp::Sum);
  world_.all_reduce_host(max, comm::ReduceOp::Max);
  return {sum[0], max[0]};
}

int64_t RunCheckpoints::load(SampleStream& train, SampleStream& valid) {
  if (!preview_) return 0;
  MEGATRON_CHECK(!state_.model.empty(), "RunCheckpoints::load: attach() the model and trainer first");
  checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(preview_->directory);
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::LoadedTraining loaded;
  trainer_->acquire_params_for_checkpoint();
  try {
    loaded = checkpoint::load_training_checkpoint(ctx_, reader, state_, args_.checkpoint);
  } catch (const Error& e) {
    // A shard that is missing, cut short or corrupt (not, say, another architecture): name where to resume.
    if (checkpoint::checkpoint_is_intact(preview_->directory)) throw;
    throw Error(str_cat(e.what(), "\n",
                        checkpoint::intact_checkpoint_hint(args_.checkpoint.load, preview_->iteration)));
  }
  trainer_->release_params_after_checkpoint(/*loaded=*/true);
  train.set_consumed(loaded.consumed_train_samples);
  valid.set_consumed(loaded.consumed_valid_samples);
  const auto [bytes, seconds] = totals(double(loaded.bytes), seconds_since(t0));
  if (!reports_) return loaded.iteration;
  std::cout << "loaded checkpoint " << reader.directory().string() << " (iteration " << reader.iteration()
            << (loaded.optimizer_loaded ? ", with optimizer state" : ", weights only") << "): " << bytes / 1e9
            << " GB read" << (world_.size() > 1 ? " by all ranks" : "") << " in " << seconds << " s ("
            << bytes / 1e9 / seconds << " GB/s); resuming at iteration " << loaded.iteration + 1 << "\n";
  const int64_t padded = state_.model.front()->config().padded_vocab_size;
  if (loaded.resized_from_padded_vocab > 0)
    std::cout << "WARNING: the checkpoint's padded vocabulary is " << loaded.resized_from_padded_vocab
              << " rows, this run's " << padded << " (--make-vocab-size-divisible-by "
              << args_.model.make_vocab_size_divisible_by << " x --tensor-model-parallel-size "
              << args_.parallel.tensor_model_parallel_size << ", vocabulary " << args_.model.vocab_size
              << "): the word embedding and output layer rows both have were loaded, "
              << (loaded.resized_from_padded_vocab < padded ? "the extra padding rows start at zero"
                                                             : "the checkpoint's extra padding rows were dropped")
              << "; the logits cover the padding, so losses differ slightly from the saved run's\n";
  return loaded.iteration;
}

void RunCheckpoints::save(int64_t iteration, const SampleStream& train, const SampleStream& valid) {
  const train::CheckpointArguments& flags = args_.checkpoint;
  if (flags.save.empty() || iteration == last_saved_) return;
  MEGATRON_CHECK(!state_.model.empty(), "RunCheckpoints::save: attach() the model and trainer first");
  state_.iteration = iteration;
  state_.consumed_train_samples = train.consumed();
  state_.consumed_valid_samples = valid.consumed();
  const auto t0 = std::chrono::steady_clock::now();
  trainer_->acquire_params_for_checkpoint();  // the snapshot reads the parameters
  const checkpoint::SaveReport report = checkpoint::save_training_checkpoint(
      ctx_, flags.save, state_, flags, flags.async_save ? &async_saver_ : nullptr, {}, &world_);
  // FSDP's gathered parameters go back to the allocator here, so the copy stream must have read them before
  // ctx's stream reuses the memory.
  if (flags.async_save && args_.fsdp_shards_params()) async_saver_.order_before_update(ctx_);
  trainer_->release_params_after_checkpoint(/*loaded=*/false);
  const auto [bytes, seconds] = totals(double(report.bytes), seconds_since(t0));
  report_save(iteration, report, bytes, seconds);
  last_saved_ = iteration;
}

void RunCheckpoints::report_save(int64_t iteration, const checkpoint::SaveReport& report, double bytes,
                                 double seconds) const {
  if (!reports_) return;
  if (!report.async) {
    std::cout << "saved checkpoint at iteration " << iteration << " to " << args_.checkpoint.save << ": " << bytes / 1e9
              << " GB in " << seconds << " s (" << bytes / 1e9 / seconds << " GB/s)\n" << std::flush;
    return;
  }
  // The training thread's stall: waiting for the previous save (if still in flight), growing the pinned
  // staging buffers (first save), queuing the device-to-host copies. Rank 0's breakdown, the max held.
  const checkpoint::AsyncSaver::Submitted& a = *report.async;
  std::cout << "asynchronous save of iteration " << iteration << " started (" << bytes / 1e9
            << " GB): training thread held " << seconds << " s (";
  if (a.waited_for_iteration >= 0)
    std::cout << "waited " << a.waited_seconds << " s for the save of iteration " << a.waited_for_iteration << "; ";
  if (a.allocate_seconds > 0)
    std::cout << "allocated " << double(a.buffer_bytes) / 1e9 << " GB of staging buffers in " << a.allocate_seconds
              << " s; ";
  std::cout << "queued the copies in " << a.enqueue_seconds << " s)\n" << std::flush;
}

void RunCheckpoints::report_published() const {
  if (reports_)
    std::cout << "asynchronous save of iteration " << async_saver_.completed_iteration() << " published (written in "
              << async_saver_.completed_seconds() << " s in the background)\n" << std::flush;
}

void RunCheckpoints::poll() {
  if (async_saver_.busy() && async_saver_.finalize(/*blocking=*/false)) report_published();
}

void RunCheckpoints::finish() {
  if (!async_saver_.busy()) return;
  async_saver_.wait();
  report_published();
}

}  // namespace megatron::trainer
