#include "megatron/checkpoint/async_saver.h"

#include <chrono>

#include "megatron/core/error.h"

namespace megatron::checkpoint {

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

void AsyncSaver::submit(std::filesystem::path root, int64_t iteration, HostSnapshot snap, nlohmann::json state,
                        SaveOptions options) {
  wait();
  snapshot_ = std::make_unique<HostSnapshot>(std::move(snap));
  iteration_ = iteration;
  error_ = nullptr;
  const HostSnapshot* s = snapshot_.get();
  thread_ = std::thread([this, s, root = std::move(root), iteration, state = std::move(state),
                         options = std::move(options)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      write_checkpoint(root, iteration, *s, state, options);
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void AsyncSaver::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  snapshot_.reset();
  if (!error_) {
    completed_iteration_ = iteration_;
    completed_seconds_ = seconds_;
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      MEGATRON_FAIL("asynchronous checkpoint save of iteration ", iteration_, " failed: ", x.what());
    }
  }
}

}  // namespace megatron::checkpoint
