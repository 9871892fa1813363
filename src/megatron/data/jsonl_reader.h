// Reading a jsonl file as batches of lines, in constant memory, for preprocess_data.
//
// Contract:
// - Lines end at '\n' (a trailing '\r' stays in the line; JSON treats it as whitespace). A last line
//   without '\n' is a line. Line numbers start at 1; byte offsets are those of the line's first byte.
// - plan_jsonl_partitions splits a file into K byte ranges that begin at line starts (the first byte after
//   a '\n' at or after k * size / K), in file order, with the line number each range starts at; ranges
//   may be empty. Concatenating the ranges' lines gives the file's lines, in order.
// - JsonlRangeReader reads one range with pread in fixed-size chunks; memory is the chunk plus the longest
//   line (a line is never split). Errors name the path and the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::data {

struct JsonlRange {
  int64_t begin = 0;       // byte offset of the first line
  int64_t end = 0;         // one past the last byte
  int64_t first_line = 1;  // line number of the line at `begin`
};

// Size in bytes of a regular file; errors name the path.
int64_t file_size_bytes(const std::string& path);

// K ranges covering the file (K >= 1). K > 1 reads the file once to count lines before each range.
std::vector<JsonlRange> plan_jsonl_partitions(const std::string& path, int partitions);

// A batch of consecutive lines; `text` holds their bytes (without '\n').
struct LineBatch {
  struct Line {
    size_t offset = 0;         // into text
    size_t size = 0;
    int64_t line_number = 0;
    int64_t byte_offset = 0;   // in the file
    int64_t input_bytes = 0;   // size + the '\n' when present
  };
  int64_t sequence = 0;        // batch number within its reader, from 0
  std::string text;
  std::vector<Line> lines;
  std::string_view line(size_t i) const { return std::string_view(text).substr(lines[i].offset, lines[i].size); }
};

class JsonlRangeReader {
 public:
  JsonlRangeReader(std::string path, JsonlRange range, size_t chunk_bytes = size_t{4} << 20);
  ~JsonlRangeReader();
  JsonlRangeReader(const JsonlRangeReader&) = delete;
  JsonlRangeReader& operator=(const JsonlRangeReader&) = delete;

  // Fills `batch` (cleared first) with lines until it holds >= target_bytes of text or max_lines lines;
  // false when the range is exhausted (batch then empty).
  bool next_batch(LineBatch& batch, size_t target_bytes, size_t max_lines);

 private:
  // The next line (valid until the next call), its file offset and its size with the '\n'; false at the end.
  bool next_line(std::string_view& line, int64_t& byte_offset, int64_t& input_bytes);

  std::string path_;
  JsonlRange range_;
  int fd_ = -1;
  std::string buffer_;
  size_t pos_ = 0, filled_ = 0;  // unread bytes are buffer_[pos_, filled_)
  int64_t file_pos_ = 0;         // next byte to read from the file
  int64_t line_number_ = 1;
  int64_t sequence_ = 0;
};

}  // namespace megatron::data
