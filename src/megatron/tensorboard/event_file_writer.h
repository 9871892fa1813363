// EventFileWriter: one TensorBoard event file, what torch.utils.tensorboard's SummaryWriter writes for Megatron's
// --tensorboard-dir: events.out.tfevents.<unix seconds>.<host>.<pid>.<n> in the directory (created with its
// parents), a first event with file_version "brain.Event:2", then one Event per scalar (wall time, step,
// Summary{tag, simple_value}), each framed as a TFRecord (tfrecord.h) and serialised by protobuf
// (event.proto, TensorFlow's field numbers).
//
// Buffering (Megatron's --tensorboard-queue-size, SummaryWriter's max_queue): scalars wait in the file stream
// until `queue_size` are pending, 120 s have passed since the last flush (SummaryWriter's flush_secs), or
// flush() is called; the training loop flushes after each log line, so a live `tensorboard --logdir` sees
// every interval. The destructor flushes. Write errors throw, naming the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace megatron::tensorboard {

class EventFileWriter {
 public:
  EventFileWriter(const std::filesystem::path& dir, int queue_size);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& serialized_event);

  std::filesystem::path path_;
  std::ofstream out_;
  int queue_size_ = 1;
  int pending_ = 0;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace megatron::tensorboard
