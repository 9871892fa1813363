#include "megatron/tensorboard/event_file_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "event.pb.h"
#include "megatron/core/error.h"
#include "megatron/tensorboard/tfrecord.h"

namespace megatron::tensorboard {
namespace {

constexpr auto kFlushEvery = std::chrono::seconds(120);

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// events.out.tfevents.<seconds>.<host>.<pid>.<n>, n the first number whose file does not exist yet (two
// writers opened by one process in the same second get different files).
std::filesystem::path event_file_name(const std::filesystem::path& dir) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(wall_seconds()));
  const std::string base = str_cat("events.out.tfevents.", seconds, ".", host_name(), ".", getpid(), ".");
  int n = 0;
  while (std::filesystem::exists(dir / str_cat(base, n))) ++n;
  return dir / str_cat(base, n);
}

}  // namespace

EventFileWriter::EventFileWriter(const std::filesystem::path& dir, int queue_size)
    : queue_size_(std::max(queue_size, 1)), last_flush_(std::chrono::steady_clock::now()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MEGATRON_CHECK(!ec, "--tensorboard-dir ", dir.string(), ": cannot create the directory (", ec.message(), ")");
  path_ = event_file_name(dir);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  MEGATRON_CHECK(out_.is_open(), "--tensorboard-dir: cannot create the event file ", path_.string());
  proto::Event first;
  first.set_wall_time(wall_seconds());
  first.set_file_version("brain.Event:2");
  write_record(first.SerializeAsString());
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (...) {  // a destructor must not throw; the last flush's error was reported by the writes before it
  }
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  proto::Event event;
  event.set_wall_time(wall_seconds());
  event.set_step(step);
  proto::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(float(value));
  write_record(event.SerializeAsString());
  if (++pending_ >= queue_size_ || std::chrono::steady_clock::now() - last_flush_ >= kFlushEvery) flush();
}

void EventFileWriter::write_record(const std::string& serialized_event) {
  const std::string record = tfrecord(serialized_event);
  out_.write(record.data(), std::streamsize(record.size()));
  MEGATRON_CHECK(out_.good(), "TensorBoard: writing ", path_.string(), " failed (disk full or the file removed?)");
}

void EventFileWriter::flush() {
  out_.flush();
  MEGATRON_CHECK(out_.good(), "TensorBoard: flushing ", path_.string(), " failed (disk full or the file removed?)");
  pending_ = 0;
  last_flush_ = std::chrono::steady_clock::now();
}

}  // namespace megatron::tensorboard
