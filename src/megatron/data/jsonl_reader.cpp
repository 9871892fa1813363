#include "megatron/data/jsonl_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

std::string errno_text() { return std::strerror(errno); }

int open_for_reading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MEGATRON_CHECK(fd >= 0, path, ": cannot open for reading: ", errno_text());
  return fd;
}

// Reads up to `size` bytes at `offset`; fewer only at the end of the file.
size_t read_at(int fd, const std::string& path, char* dst, size_t size, int64_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, dst + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    MEGATRON_CHECK(n >= 0, path, ": read of ", size - done, " bytes at byte offset ", offset + done,
                   " failed: ", errno_text());
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

}  // namespace

int64_t file_size_bytes(const std::string& path) {
  struct stat st {};
  MEGATRON_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot stat: ", errno_text());
  MEGATRON_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  return static_cast<int64_t>(st.st_size);
}

std::vector<JsonlRange> plan_jsonl_partitions(const std::string& path, int partitions) {
  MEGATRON_CHECK(partitions >= 1, path, ": --partitions must be >= 1, got ", partitions);
  const int64_t size = file_size_bytes(path);
  std::vector<JsonlRange> ranges(static_cast<size_t>(partitions));
  ranges.front().begin = 0;
  ranges.back().end = size;
  if (partitions == 1) return ranges;

  // One pass: count '\n' up to each boundary. Range k begins after the first '\n' at or after
  // target_k - 1 (so a target that is already a line start is kept).
  const int fd = open_for_reading(path);
  std::vector<char> chunk(static_cast<size_t>(std::clamp<int64_t>(size, 1, int64_t{4} << 20)));
  int64_t offset = 0, lines = 0;
  int k = 1;
  const auto target = [&](int part) { return size * part / partitions; };
  const auto close_range = [&](int part, int64_t begin, int64_t first_line) {
    ranges[static_cast<size_t>(part)].begin = begin;
    ranges[static_cast<size_t>(part)].first_line = first_line;
    ranges[static_cast<size_t>(part - 1)].end = begin;
  };
  try {
    while (k < partitions && offset < size) {
      const size_t n = read_at(fd, path, chunk.data(), chunk.size(), offset);
      MEGATRON_CHECK(n > 0, path, ": file shrank while reading: no bytes at offset ", offset, " of ", size);
      for (size_t i = 0; i < n && k < partitions; ++i) {
        if (chunk[i] != '\n') continue;
        ++lines;
        const int64_t after = offset + static_cast<int64_t>(i) + 1;
        while (k < partitions && after - 1 >= target(k) - 1) close_range(k++, after, lines + 1);
      }
      offset += static_cast<int64_t>(n);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  while (k < partitions) close_range(k++, size, lines + 1);  // no '\n' after the target: empty ranges
  return ranges;
}

JsonlRangeReader::JsonlRangeReader(std::string path, JsonlRange range, size_t chunk_bytes)
    : path_(std::move(path)),
      range_(range),
      // No larger than the range: a small file (or partition) needs no multi-MB buffer.
      buffer_(std::clamp<size_t>(static_cast<size_t>(std::max<int64_t>(range.end - range.begin, 0)), 64,
                                 std::max<size_t>(chunk_bytes, 64)),
              '\0'),
      file_pos_(range.begin), line_number_(range.first_line) {
  fd_ = open_for_reading(path_);
}

JsonlRangeReader::~JsonlRangeReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool JsonlRangeReader::next_line(std::string_view& line, int64_t& byte_offset, int64_t& input_bytes) {
  size_t scanned = pos_;  // bytes before `scanned` hold no '\n'
  while (true) {
    const char* nl = static_cast<const char*>(std::memchr(buffer_.data() + scanned, '\n', filled_ - scanned));
    const bool at_end = file_pos_ >= range_.end;
    if (nl != nullptr || (at_end && pos_ < filled_)) {
      const size_t size = nl != nullptr ? static_cast<size_t>(nl - (buffer_.data() + pos_)) : filled_ - pos_;
      line = std::string_view(buffer_.data() + pos_, size);
      byte_offset = file_pos_ - static_cast<int64_t>(filled_ - pos_);
      input_bytes = static_cast<int64_t>(size) + (nl != nullptr ? 1 : 0);
      pos_ += static_cast<size_t>(input_bytes);
      return true;
    }
    if (at_end) return false;
    // Keep the partial line, then read more (growing the buffer when one line fills it).
    scanned = filled_;
    if (pos_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + pos_, filled_ - pos_);
      scanned -= pos_;
      filled_ -= pos_;
      pos_ = 0;
    }
    if (filled_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    const size_t want = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(buffer_.size() - filled_), range_.end - file_pos_));
    const size_t n = read_at(fd_, path_, buffer_.data() + filled_, want, file_pos_);
    MEGATRON_CHECK(n == want, path_, ": file shrank while reading: expected ", want, " bytes at byte offset ",
                   file_pos_, ", got ", n);
    filled_ += n;
    file_pos_ += static_cast<int64_t>(n);
  }
}

bool JsonlRangeReader::next_batch(LineBatch& batch, size_t target_bytes, size_t max_lines) {
  batch.text.clear();
  batch.lines.clear();
  std::string_view line;
  int64_t byte_offset = 0, input_bytes = 0;
  while (batch.lines.size() < max_lines && batch.text.size() < target_bytes &&
         next_line(line, byte_offset, input_bytes)) {
    batch.lines.push_back({batch.text.size(), line.size(), line_number_++, byte_offset, input_bytes});
    batch.text.append(line);
  }
  if (batch.lines.empty()) return false;
  batch.sequence = sequence_++;
  return true;
}

}  // namespace megatron::data
