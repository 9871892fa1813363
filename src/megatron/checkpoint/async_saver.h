// AsyncSaver: --async-save. The training thread takes a HostSnapshot (shard_writer.h, step 1: device
// tensors copied to pinned host buffers, CPU tensors copied) and hands it over; a background thread writes
// it (steps 2 and 3) while training goes on.
//
// Contract: at most one save is in flight. submit() and wait() first wait for the previous save; an error
// thrown by the writer is rethrown on the calling (training) thread by the next submit() or wait(), with
// the iteration it belongs to. The snapshot is released on the training thread (in wait()), so pinned
// buffers go back to the context's allocator from the thread that owns it. The destructor waits but does
// not throw (call wait() before exit to see a failure).
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "megatron/checkpoint/shard_writer.h"

namespace megatron::checkpoint {

class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Waits for the previous save (rethrowing its error), then starts writing `snap` in the background.
  void submit(std::filesystem::path root, int64_t iteration, HostSnapshot snap, nlohmann::json state,
              SaveOptions options);
  // Blocks until the save in flight (if any) is complete; rethrows its error.
  void wait();
  bool busy() const { return thread_.joinable(); }
  // The iteration and background seconds of the last save wait() completed (-1 and 0 before any).
  int64_t completed_iteration() const { return completed_iteration_; }
  double completed_seconds() const { return completed_seconds_; }

 private:
  std::thread thread_;
  std::unique_ptr<HostSnapshot> snapshot_;
  std::exception_ptr error_;
  int64_t iteration_ = 0;
  double seconds_ = 0;  // written by the thread, read after join
  int64_t completed_iteration_ = -1;
  double completed_seconds_ = 0;
};

}  // namespace megatron::checkpoint
