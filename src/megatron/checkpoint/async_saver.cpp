#include "megatron/checkpoint/async_saver.h"

#include <chrono>

#include "megatron/core/error.h"

namespace megatron::checkpoint {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

AsyncSaver::Submitted AsyncSaver::submit(Context& ctx, std::filesystem::path root, int64_t iteration,
                                         const std::vector<SaveItem>& items, nlohmann::json state,
                                         SaveOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  Submitted report;
  if (pending_) {
    report.waited_for_iteration = iteration_;
    finalize(true);
    report.waited_seconds = seconds_since(t0);
  }
  const int rank = world_ != nullptr ? world_->rank() : 0;
  std::filesystem::path tmp;
  if (!single()) tmp = prepare_save_directory_on_all(world_, root, iteration, options);

  snapshot_ = stager_.stage(ctx, rank, items);
  const SnapshotStager::Timing& timing = stager_.last_timing();
  report.allocate_seconds = timing.allocate_seconds;
  report.enqueue_seconds = timing.enqueue_seconds;
  report.bytes = timing.bytes;
  report.buffer_bytes = timing.allocated_bytes;

  ctx_ = &ctx;
  root_ = std::move(root);
  iteration_ = iteration;
  state_ = std::move(state);
  options_ = std::move(options);
  pieces_.clear();
  error_ = nullptr;
  seconds_ = 0;
  done_.store(false);
  pending_ = true;
  thread_ = std::thread([this, tmp] {
    const auto start = std::chrono::steady_clock::now();
    try {
      stager_.wait_copies();
      if (single()) {
        write_checkpoint(root_, iteration_, snapshot_, state_, options_);
      } else {
        pieces_ = write_rank_file(tmp, snapshot_, iteration_, options_.hooks);
      }
    } catch (...) {
      error_ = std::current_exception();
    }
    seconds_ = seconds_since(start);
    done_.store(true);
  });
  report.held_seconds = seconds_since(t0);
  return report;
}

bool AsyncSaver::finalize(bool blocking) {
  if (!pending_) return true;
  if (!single() && !blocking) {
    double writing[1] = {done_.load() ? 0.0 : 1.0};
    world_->all_reduce_host(writing, comm::ReduceOp::Max);
    if (writing[0] != 0.0) return false;
  } else if (single() && !blocking && !done_.load()) {
    return false;
  }
  thread_.join();
  pending_ = false;
  std::exception_ptr error = error_;
  error_ = nullptr;
  try {
    if (single()) {
      if (error) std::rethrow_exception(error);
    } else {
      gather_and_publish(*ctx_, world_, root_, iteration_, pieces_, state_, options_, error);
    }
  } catch (const std::exception& e) {
    MEGATRON_FAIL("asynchronous checkpoint save of iteration ", iteration_, " failed: ", e.what());
  }
  completed_iteration_ = iteration_;
  completed_seconds_ = seconds_;
  return true;
}

}  // namespace megatron::checkpoint
