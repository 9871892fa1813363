// AsyncSaver: --async-save. The training thread pays only for queuing the snapshot; a background thread
// writes this rank's file while training goes on; the save is published (metadata, rename, tracker) once
// every rank's file is written.
//
// Per save, on the training thread:
//   submit()   finalizes the previous save if it is still in flight (blocking; the time is reported),
//              prepares the temporary directory (rank 0; every rank waits for it), stages the pieces
//              (snapshot_stager.h: reusable pinned buffers allocated at the first save; device-to-host
//              copies queued on a copy stream after the work queued on ctx's stream so far), and starts the
//              writer thread, which waits for the copies, then writes and fsyncs rank_<r>.safetensors (and,
//              in a world of one, publishes the checkpoint itself).
//   order_before_update(ctx)  must be queued before the first work that modifies a saved tensor: the next
//              optimizer step (optim::AdamW::before_next_update; save_training_checkpoint registers it).
//              ctx's stream then waits for the copies on the device; the host does not wait.
//   finalize(blocking)  with several ranks, called by every rank at the same points (every iteration while
//              busy(), as Megatron's maybe_finalize_async_save): a host all-reduce asks whether every rank's
//              writer is done; if so (or when `blocking`) the pieces are gathered and rank 0 publishes.
//              Collectives run only here and in submit(), on the training thread, never on the writer.
//
// Contract: at most one save is in flight. An error of the writer (on any rank) is rethrown on every rank
// by the finalize() that completes that save, naming the iteration. The staged buffers belong to this
// object and are reused; it must be destroyed before the Context it staged from. The destructor joins the
// writer but neither publishes nor throws (call wait() before exit).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <thread>
#include <vector>

#include "megatron/checkpoint/shard_writer.h"
#include "megatron/checkpoint/snapshot_stager.h"

namespace megatron::checkpoint {

class AsyncSaver {
 public:
  // `world`: the ranks that save together (nullptr: a world of one); it must outlive this object.
  explicit AsyncSaver(comm::Communicator* world = nullptr) : world_(world) {}
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Where the training thread's time went in submit().
  struct Submitted {
    double held_seconds = 0;            // all of submit()
    double waited_seconds = 0;          // finalizing the previous save, still in flight
    int64_t waited_for_iteration = -1;  // its iteration (-1: none was in flight)
    double allocate_seconds = 0;        // growing the staging buffers (the first save)
    double enqueue_seconds = 0;         // queuing the copies (on a CPU context: making them)
    uint64_t bytes = 0;                 // staged by this rank
    uint64_t buffer_bytes = 0;          // size of this rank's staging buffers
  };
  // Training thread, after the step whose state `items` hold. Collective with several ranks.
  Submitted submit(Context& ctx, std::filesystem::path root, int64_t iteration, const std::vector<SaveItem>& items,
                   nlohmann::json state, SaveOptions options);
  void order_before_update(Context& ctx) { stager_.order_before_update(ctx); }
  // Returns true when no save is in flight any more (published), false when some rank still writes (only
  // without `blocking`). Collective with several ranks while busy().
  bool finalize(bool blocking);
  void wait() { finalize(true); }
  bool busy() const { return pending_; }
  // The last save finalize() completed: its iteration (-1 before any) and this rank's write time.
  int64_t completed_iteration() const { return completed_iteration_; }
  double completed_seconds() const { return completed_seconds_; }

 private:
  bool single() const { return world_ == nullptr || world_->size() == 1; }

  comm::Communicator* world_ = nullptr;
  SnapshotStager stager_;
  std::thread thread_;
  bool pending_ = false;
  std::atomic<bool> done_{false};  // the writer finished (set last by the thread)
  // The save in flight (written by the thread before done_, read after join).
  Context* ctx_ = nullptr;
  std::filesystem::path root_;
  int64_t iteration_ = 0;
  nlohmann::json state_;
  SaveOptions options_;
  HostSnapshot snapshot_;
  std::vector<SavedPiece> pieces_;
  std::exception_ptr error_;
  double seconds_ = 0;
  int64_t completed_iteration_ = -1;
  double completed_seconds_ = 0;
};

}  // namespace megatron::checkpoint
