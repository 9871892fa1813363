// RunCheckpoints: what a training run does with checkpoints (Megatron's --save/--load rules, docs/checkpoint.md),
// with its reports on rank 0:
//   - before the model exists: what --load holds (preview), since a resumed run takes the checkpoint's seed
//     (dropout and init draw from it) unless --no-load-rng, --finetune or a release checkpoint says otherwise;
//     with --load-fallback-to-intact every shard of it is checked first, and a checkpoint that is not intact
//     is replaced by the newest intact older one; without, a bad checkpoint stops the run with an error
//     naming that one;
//   - load(): every rank reads what it holds, at any tensor- and data-parallel layout; the data streams
//     continue where the checkpoint's run stopped; returns the iteration to resume after;
//   - save(iteration): every rank writes its pieces (collective over the world); with --async-save the
//     training thread only queues copies and a background thread writes; at most one save per iteration;
//   - poll() after every iteration publishes an asynchronous save whose files are all written; finish() waits
//     for the one in flight (a run must not end before its last save is published).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "megatron/checkpoint/async_saver.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/comm/communicator.h"
#include "megatron/trainer/batches.h"
#include "megatron/trainer/trainer.h"

namespace megatron::trainer {

class RunCheckpoints {
 public:
  // Reads --load's tracker and state (no tensors yet). `world` must outlive this object.
  RunCheckpoints(Context& ctx, const train::Arguments& args, comm::Communicator& world);

  // The seed the model is built with: the checkpoint's when the run resumes with its RNG state, else --seed.
  uint64_t model_seed() const;
  // Binds the model chunks and the trainer whose state is saved and loaded.
  void attach(std::vector<nn::GPTModel*> chunks, Trainer& trainer);

  // Loads --load (when it holds a checkpoint) and positions the streams; returns the iteration it holds (0
  // with --finetune or a release checkpoint, or when there is nothing to load).
  int64_t load(SampleStream& train, SampleStream& valid);
  void save(int64_t iteration, const SampleStream& train, const SampleStream& valid);
  void poll();
  void finish();

 private:
  // --load-fallback-to-intact: the checkpoint the tracker names when every shard of it is intact, else the
  // newest intact older one (collective: the ranks share the reading); throws when there is none.
  std::filesystem::path intact_checkpoint(const std::filesystem::path& root);
  // Sum of bytes and maximum of seconds over the ranks (a collective).
  std::pair<double, double> totals(double bytes, double seconds);
  void report_save(int64_t iteration, const checkpoint::SaveReport& report, double bytes, double seconds) const;
  void report_published() const;

  Context& ctx_;
  const train::Arguments& args_;
  comm::Communicator& world_;
  bool reports_ = false;  // rank 0 prints
  std::optional<checkpoint::CheckpointPreview> preview_;
  checkpoint::TrainingState state_{};
  Trainer* trainer_ = nullptr;
  checkpoint::AsyncSaver async_saver_;
  int64_t last_saved_ = -1;
};

}  // namespace megatron::trainer
