#include "megatron/data/preprocess_data.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/core/progress.h"
#include "megatron/data/json_fields.h"
#include "megatron/data/jsonl_reader.h"
#include "megatron/data/utf8.h"

namespace megatron::data {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(50);  // waits re-check cancellation this often

// The line's first 80 bytes for a message: cut at a character boundary; control bytes and ill-formed
// UTF-8 shown as \xNN.
std::string snippet(std::string_view line) {
  constexpr size_t kMax = 80;
  size_t n = std::min(line.size(), kMax);
  if (n < line.size()) {
    while (n > 0 && (static_cast<unsigned char>(line[n]) & 0xC0) == 0x80) --n;
  }
  const std::string_view head = line.substr(0, n);
  std::string out;
  const auto hex = [&out](unsigned char c) {
    static const char* digits = "0123456789ABCDEF";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 15];
  };
  for (size_t i = 0; i < head.size();) {
    const auto c = static_cast<unsigned char>(head[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F) hex(c); else out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (c < 0xC2 || i + len > head.size() || !is_valid_utf8(head.substr(i, len))) {
      hex(c);
      ++i;
      continue;
    }
    out.append(head.substr(i, len));
    i += len;
  }
  if (n < line.size()) out += "...";
  return out;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--:--:--";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

struct Issue {
  LineIssue kind;
  int64_t line_number;
  int64_t byte_offset;
  std::string detail;
};

// What the workers hand to the writer for one batch.
struct EncodedBatch {
  struct Key {
    std::vector<int32_t> tokens;
    std::vector<int32_t> lengths;           // per sequence
    std::vector<uint32_t> sequences_per_doc;
  };
  struct Line {
    int64_t input_bytes = 0;
    bool written = false;
  };
  std::vector<Line> lines;
  std::vector<Issue> issues;  // in line order
  std::vector<Key> keys;
};

// State shared by every partition of one run: options, log, progress, report limits, cancellation.
class RunState {
 public:
  RunState(const PreprocessOptions& options, std::ostream& log, int64_t input_bytes)
      : options(options), log_(log), input_bytes_(input_bytes), start_(Clock::now()),
        progress_("preprocessing " + options.input, input_bytes >> 20, "MB") {}

  const PreprocessOptions& options;
  std::atomic<bool> cancelled{false};

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void finish_progress() { progress_.done(); }

  // Counts a processed line; prints a progress line when the written documents reach a multiple of
  // log_interval.
  void count_line(int64_t input_bytes, bool written) {
    const int64_t bytes = bytes_.fetch_add(input_bytes) + input_bytes;
    progress_.update(bytes >> 20);
    if (!written) return;
    const int64_t docs = documents_.fetch_add(1) + 1;
    if (options.log_interval <= 0 || docs % options.log_interval != 0) return;
    const double t = std::max(elapsed(), 1e-9);
    const double rate = static_cast<double>(bytes) / t;
    const double remaining = static_cast<double>(std::max<int64_t>(input_bytes_ - bytes, 0));
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "Processed %lld documents (%.1f docs/s, %.2f MB/s), %.1f%% of the input, ETA %s",
                  static_cast<long long>(docs), static_cast<double>(docs) / t, rate / (1 << 20),
                  input_bytes_ > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(input_bytes_) : 100.0,
                  format_duration(rate > 0 ? remaining / rate : -1).c_str());
    std::lock_guard lock(log_mutex_);
    log_ << buf << std::endl;
  }

  // Reports an issue (up to max_reports per kind); under strict, a line-skipping issue throws.
  void report(const Issue& issue) {
    if (issue.kind == LineIssue::kBlankLine) return;
    const bool fatal = options.strict && line_issue_skips_line(issue.kind);
    const std::string where = str_cat(options.input, ":", issue.line_number, " (byte ", issue.byte_offset, "): ");
    const std::string what = str_cat(line_issue_name(issue.kind), ": ", issue.detail);
    if (fatal) {
      throw Error(str_cat(where, what, " (--strict: stopping; no .idx is written)"));
    }
    const int n = reported_[static_cast<int>(issue.kind)].fetch_add(1);
    if (n > options.max_reports) return;
    std::lock_guard lock(log_mutex_);
    if (n == options.max_reports) {
      log_ << "(further '" << line_issue_name(issue.kind) << "' reports suppressed; see the summary)" << std::endl;
    } else {
      log_ << where << what << (line_issue_skips_line(issue.kind) ? "; line skipped" : "") << std::endl;
    }
  }

 private:
  std::ostream& log_;
  std::mutex log_mutex_;
  const int64_t input_bytes_;
  const Clock::time_point start_;
  std::atomic<int64_t> bytes_{0}, documents_{0};
  Progress progress_;  // the terminal's progress line over the input's megabytes (core/progress.h)
  std::array<std::atomic<int>, kNumLineIssues> reported_{};
};

// Tokenizes the lines of one batch.
class LineEncoder {
 public:
  LineEncoder(const PreprocessOptions& options, const Tokenizer& tokenizer)
      : options_(options), tokenizer_(tokenizer) {}

  void encode(const LineBatch& batch, EncodedBatch& out) const {
    out.lines.assign(batch.lines.size(), {});
    out.issues.clear();
    out.keys.assign(options_.json_keys.size(), {});
    for (size_t i = 0; i < batch.lines.size(); ++i) {
      const auto& ref = batch.lines[i];
      out.lines[i].input_bytes = ref.input_bytes;
      out.lines[i].written = encode_line(batch.line(i), ref, out);
    }
  }

 private:
  bool encode_line(std::string_view line, const LineBatch::Line& ref, EncodedBatch& out) const {
    const auto issue = [&](LineIssue kind, std::string detail) {
      out.issues.push_back({kind, ref.line_number, ref.byte_offset, std::move(detail)});
      return false;
    };
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return issue(LineIssue::kBlankLine, "");
    const JsonFieldsResult parsed = parse_json_fields(line, options_.json_keys);
    if (!parsed.ok) {
      return issue(LineIssue::kMalformedJson,
                   str_cat(parsed.error, " at byte ", parsed.error_offset, " of the line: ", snippet(line)));
    }
    std::string missing, wrong;
    for (size_t k = 0; k < parsed.fields.size(); ++k) {
      const auto& field = parsed.fields[k];
      const std::string quoted = str_cat("\"", options_.json_keys[k], "\"");
      if (field.kind == JsonField::Kind::Missing) missing += (missing.empty() ? "" : ", ") + quoted;
      if (field.kind == JsonField::Kind::OtherType) {
        wrong += str_cat(wrong.empty() ? "" : ", ", quoted, " is ", field.type_name);
      }
    }
    if (!missing.empty()) return issue(LineIssue::kMissingKey, str_cat("no key ", missing, ": ", snippet(line)));
    if (!wrong.empty()) {
      return issue(LineIssue::kWrongType,
                   str_cat(wrong, " (expected a string or a list of strings): ", snippet(line)));
    }

    // Tokenize every key first, so that a tokenizer error leaves no partial document behind.
    std::vector<size_t> token_mark(out.keys.size()), length_mark(out.keys.size());
    for (size_t k = 0; k < out.keys.size(); ++k) {
      token_mark[k] = out.keys[k].tokens.size();
      length_mark[k] = out.keys[k].lengths.size();
    }
    std::vector<Issue> warnings;
    for (size_t k = 0; k < out.keys.size(); ++k) {
      auto& key = out.keys[k];
      const auto& field = parsed.fields[k];
      uint32_t sequences = 0;
      try {
        for (const std::string& text : field.values) {
          std::vector<int32_t> ids = tokenizer_.encode(text);
          if (ids.empty()) continue;
          key.tokens.insert(key.tokens.end(), ids.begin(), ids.end());
          key.lengths.push_back(static_cast<int32_t>(ids.size()));
          ++sequences;
        }
      } catch (const std::exception& e) {
        for (size_t j = 0; j <= k; ++j) {
          out.keys[j].tokens.resize(token_mark[j]);
          out.keys[j].lengths.resize(length_mark[j]);
          if (j < k) out.keys[j].sequences_per_doc.pop_back();
        }
        return issue(LineIssue::kTokenizerError,
                     str_cat("key \"", options_.json_keys[k], "\": ", e.what(), ": ", snippet(line)));
      }
      if (sequences > 0 && options_.append_eod) {
        key.tokens.push_back(tokenizer_.eod());
        ++key.lengths.back();
      }
      if (sequences == 0) {
        warnings.push_back({LineIssue::kEmptyDocument, ref.line_number, ref.byte_offset,
                            str_cat("key \"", options_.json_keys[k], "\" has no tokens",
                                    options_.keep_empty ? " (kept: --keep-empty)" : " (written as an empty document)")});
        if (options_.keep_empty) {
          if (options_.append_eod) key.tokens.push_back(tokenizer_.eod());
          key.lengths.push_back(options_.append_eod ? 1 : 0);
          sequences = 1;
        }
      }
      if (field.invalid_utf8) {
        warnings.push_back({LineIssue::kInvalidUtf8, ref.line_number, ref.byte_offset,
                            str_cat("key \"", options_.json_keys[k],
                                    "\": ill-formed UTF-8 replaced by U+FFFD: ", snippet(line))});
      }
      key.sequences_per_doc.push_back(sequences);
    }
    out.issues.insert(out.issues.end(), warnings.begin(), warnings.end());
    return true;
  }

  const PreprocessOptions& options_;
  const Tokenizer& tokenizer_;
};

struct PartitionTotals {
  int64_t lines = 0, documents = 0;
  std::array<int64_t, kNumLineIssues> issues{};
  std::vector<int64_t> tokens;
};

// One byte range of the input -> one dataset per key: a reader thread, `workers` encoder threads and the
// writer (the calling thread). At most `window` batches are between the reader and the writer.
class PartitionRun {
 public:
  PartitionRun(RunState& run, const TokenizerFactory& make_tokenizer, JsonlRange range,
               std::vector<std::string> output_prefixes, TokenDType dtype, int workers)
      : run_(run), make_tokenizer_(make_tokenizer), range_(range), output_prefixes_(std::move(output_prefixes)),
        dtype_(dtype), workers_(std::max(workers, 1)), window_(std::max(4 * workers_, 8)) {}

  PartitionTotals run() {
    const PreprocessOptions& options = run_.options;
    std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
    for (const auto& prefix : output_prefixes_) writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype_));
    PartitionTotals totals;
    totals.tokens.assign(output_prefixes_.size(), 0);

    std::vector<std::thread> threads;
    threads.emplace_back([this] { guarded([this] { read_loop(); }); });
    for (int w = 0; w < workers_; ++w) threads.emplace_back([this] { guarded([this] { encode_loop(); }); });
    const auto stop_threads = [&] {
      {
        std::lock_guard lock(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      for (auto& t : threads) t.join();
    };
    try {
      for (int64_t next = 0;; ++next) {
        EncodedBatch batch;
        if (!take_result(next, batch)) break;
        for (const Issue& issue : batch.issues) {
          ++totals.issues[static_cast<int>(issue.kind)];
          run_.report(issue);
        }
        for (size_t k = 0; k < writers.size(); ++k) {
          const auto& key = batch.keys[k];
          size_t token = 0, sequence = 0, doc = 0;
          for (const auto& line : batch.lines) {
            if (!line.written) continue;
            for (uint32_t s = 0; s < key.sequences_per_doc[doc]; ++s, ++sequence) {
              const auto length = static_cast<size_t>(key.lengths[sequence]);
              writers[k]->add_sequence(std::span<const int32_t>(key.tokens.data() + token, length));
              token += length;
            }
            writers[k]->end_document();
            ++doc;
          }
          totals.tokens[k] += static_cast<int64_t>(key.tokens.size());
        }
        for (const auto& line : batch.lines) {
          ++totals.lines;
          totals.documents += line.written ? 1 : 0;
          run_.count_line(line.input_bytes, line.written);
        }
        {
          std::lock_guard lock(mutex_);
          written_ = next + 1;
        }
        cv_.notify_all();
      }
    } catch (...) {
      record_error(std::current_exception());
    }
    stop_threads();
    if (error_) std::rethrow_exception(error_);
    MEGATRON_CHECK(!run_.cancelled.load(), options.input, ": cancelled because another partition failed");
    for (auto& writer : writers) writer->prepare();  // every key's files complete before any replaces its dataset
    for (auto& writer : writers) writer->commit();
    return totals;
  }

 private:
  template <class F>
  void guarded(F body) {
    try {
      body();
    } catch (...) {
      record_error(std::current_exception());
    }
  }

  void record_error(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = error;
      stop_ = true;
    }
    run_.cancelled = true;
    cv_.notify_all();
  }

  bool stopping() const { return stop_ || run_.cancelled.load(); }

  void read_loop() {
    JsonlRangeReader reader(run_.options.input, range_);
    while (true) {
      auto batch = std::make_unique<LineBatch>();
      const bool more = reader.next_batch(*batch, run_.options.batch_bytes, run_.options.batch_lines);
      std::unique_lock lock(mutex_);
      if (!more) {
        input_done_ = true;
        batches_read_ = batch_count_;
        cv_.notify_all();
        return;
      }
      while (!stopping() && batch_count_ >= written_ + window_) cv_.wait_for(lock, kPoll);
      if (stopping()) return;
      ++batch_count_;
      work_.push_back(std::move(batch));
      cv_.notify_all();
    }
  }

  void encode_loop() {
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer_();
    const LineEncoder encoder(run_.options, *tokenizer);
    while (true) {
      std::unique_ptr<LineBatch> batch;
      {
        std::unique_lock lock(mutex_);
        while (!stopping() && work_.empty() && !input_done_) cv_.wait_for(lock, kPoll);
        if (stopping() || work_.empty()) return;
        batch = std::move(work_.front());
        work_.pop_front();
      }
      EncodedBatch encoded;
      encoder.encode(*batch, encoded);
      {
        std::lock_guard lock(mutex_);
        results_.emplace(batch->sequence, std::move(encoded));
      }
      cv_.notify_all();
    }
  }

  // The result of batch `next`; false when the input is done (or the run stops).
  bool take_result(int64_t next, EncodedBatch& out) {
    std::unique_lock lock(mutex_);
    while (true) {
      if (error_) std::rethrow_exception(error_);
      if (run_.cancelled.load()) return false;
      auto it = results_.find(next);
      if (it != results_.end()) {
        out = std::move(it->second);
        results_.erase(it);
        return true;
      }
      if (input_done_ && next >= batches_read_) return false;
      cv_.wait_for(lock, kPoll);
    }
  }

  RunState& run_;
  const TokenizerFactory& make_tokenizer_;
  const JsonlRange range_;
  const std::vector<std::string> output_prefixes_;
  const TokenDType dtype_;
  const int workers_;
  const int64_t window_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<LineBatch>> work_;
  std::map<int64_t, EncodedBatch> results_;
  int64_t batch_count_ = 0, batches_read_ = 0, written_ = 0;
  bool input_done_ = false, stop_ = false;
  std::exception_ptr error_;
};

// An intermediate dataset (a partition's), with any temporary files.
void remove_dataset(const std::string& prefix) {
  std::error_code ignored;
  for (const auto& path : {idx_path(prefix), bin_path(prefix), temporary_idx_path(prefix), temporary_bin_path(prefix)})
    std::filesystem::remove(path, ignored);
}

void validate(const PreprocessOptions& o) {
  std::vector<std::string> problems;
  if (o.input.empty()) problems.push_back("--input is required");
  if (o.output_prefix.empty()) problems.push_back("--output-prefix is required");
  if (o.json_keys.empty()) problems.push_back("--json-keys needs at least one key");
  if (std::set<std::string>(o.json_keys.begin(), o.json_keys.end()).size() != o.json_keys.size()) {
    problems.push_back("--json-keys has a key twice");
  }
  if (o.workers < 1) problems.push_back(str_cat("--workers must be >= 1, got ", o.workers));
  if (o.partitions < 1) problems.push_back(str_cat("--partitions must be >= 1, got ", o.partitions));
  if (o.batch_bytes < 1 || o.batch_lines < 1) problems.push_back("batch size must be >= 1");
  if (!problems.empty()) {
    std::string text = "preprocess_data: invalid options:";
    for (const auto& p : problems) text += "\n  " + p;
    throw Error(text);
  }
}

// Partition p's output prefix per key: the final outputs' with one partition, else "<output prefix>_<p>"'s
// (merged into the final outputs afterwards).
std::vector<std::vector<std::string>> partition_prefixes(const PreprocessOptions& options, int k_parts) {
  std::vector<std::vector<std::string>> part_prefixes(static_cast<size_t>(k_parts));
  for (int p = 0; p < k_parts; ++p) {
    for (const auto& key : options.json_keys) {
      part_prefixes[static_cast<size_t>(p)].push_back(
          k_parts == 1 ? document_prefix(options.output_prefix, key)
                       : document_prefix(str_cat(options.output_prefix, "_", p), key));
    }
  }
  return part_prefixes;
}

// The failure to report of partitions that ran in parallel: the root cause, not a "cancelled because another
// partition failed" consequence; else the first failure; null when none failed.
std::exception_ptr root_failure(const std::vector<std::exception_ptr>& errors) {
  std::exception_ptr first, root;
  for (const auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (!root && std::string_view(ex.what()).find("another partition failed") == std::string_view::npos) root = e;
    } catch (...) {
      if (!root) root = e;
    }
  }
  return root ? root : first;
}

// Runs the partitions at once, one thread each (a failing one cancels the others), into totals[p]; throws
// root_failure's exception.
void run_partitions(RunState& run, const TokenizerFactory& make_tokenizer, const std::vector<JsonlRange>& ranges,
                    const std::vector<std::vector<std::string>>& part_prefixes, TokenDType dtype,
                    std::vector<PartitionTotals>& totals) {
  const int k_parts = static_cast<int>(ranges.size());
  const PreprocessOptions& options = run.options;
  // Workers are shared out over the partitions (at least one each), as Megatron's workers / partitions.
  std::vector<std::exception_ptr> errors(ranges.size());
  std::vector<std::thread> threads;
  for (int p = 0; p < k_parts; ++p) {
    const int workers = std::max(1, options.workers / k_parts + (p < options.workers % k_parts ? 1 : 0));
    threads.emplace_back([&, p, workers] {
      try {
        PartitionRun part(run, make_tokenizer, ranges[static_cast<size_t>(p)], part_prefixes[static_cast<size_t>(p)],
                          dtype, workers);
        totals[static_cast<size_t>(p)] = part.run();
      } catch (...) {
        errors[static_cast<size_t>(p)] = std::current_exception();
        run.cancelled = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (const std::exception_ptr failure = root_failure(errors)) std::rethrow_exception(failure);
}

// Merges key k's partition datasets into output_prefixes[k] (every key's merged files are complete before any
// replaces its dataset), then removes the partitions' files.
void merge_partitions(const std::vector<std::vector<std::string>>& part_prefixes,
                      const std::vector<std::string>& output_prefixes, size_t num_keys, TokenDType dtype) {
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (size_t k = 0; k < num_keys; ++k) {
    writers.push_back(std::make_unique<IndexedDatasetWriter>(output_prefixes[k], dtype));
    for (const auto& prefixes : part_prefixes) writers.back()->append(IndexedDatasetReader(prefixes[k]));
    writers.back()->prepare();
  }
  for (auto& writer : writers) writer->commit();
  for (const auto& prefixes : part_prefixes) {
    for (const auto& prefix : prefixes) remove_dataset(prefix);
  }
}

// Adds the partitions' counts to the summary (tokens per key).
void add_totals(const std::vector<PartitionTotals>& totals, size_t num_keys, PreprocessSummary& summary) {
  summary.tokens.assign(num_keys, 0);
  for (const auto& t : totals) {
    summary.lines += t.lines;
    summary.documents += t.documents;
    for (int i = 0; i < kNumLineIssues; ++i) summary.issues[static_cast<size_t>(i)] += t.issues[static_cast<size_t>(i)];
    for (size_t k = 0; k < t.tokens.size(); ++k) summary.tokens[k] += t.tokens[k];
  }
}

}  // namespace

const char* line_issue_name(LineIssue issue) {
  switch (issue) {
    case LineIssue::kMalformedJson: return "malformed JSON";
    case LineIssue::kMissingKey: return "missing key";
    case LineIssue::kWrongType: return "wrong value type";
    case LineIssue::kTokenizerError: return "tokenizer error";
    case LineIssue::kEmptyDocument: return "empty document";
    case LineIssue::kInvalidUtf8: return "invalid UTF-8";
    case LineIssue::kBlankLine: return "blank line";
  }
  return "?";
}

bool line_issue_skips_line(LineIssue issue) {
  return issue == LineIssue::kMalformedJson || issue == LineIssue::kMissingKey || issue == LineIssue::kWrongType ||
         issue == LineIssue::kTokenizerError || issue == LineIssue::kBlankLine;
}

int64_t PreprocessSummary::skipped_lines() const {
  int64_t n = 0;
  for (int i = 0; i < kNumLineIssues; ++i) {
    if (line_issue_skips_line(static_cast<LineIssue>(i))) n += issues[static_cast<size_t>(i)];
  }
  return n;
}

std::string document_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

PreprocessSummary preprocess_jsonl(const PreprocessOptions& options, const TokenizerFactory& make_tokenizer,
                                   std::ostream& log) {
  validate(options);
  PreprocessSummary summary;
  summary.input_bytes = file_size_bytes(options.input);
  {
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer();
    summary.dtype = token_dtype_for_vocab_size(tokenizer->vocab_size());
    MEGATRON_CHECK(!options.append_eod || tokenizer->eod() >= 0,
                   "--append-eod: the tokenizer has no end-of-document token (eod id is -1)");
  }
  for (const auto& key : options.json_keys) summary.output_prefixes.push_back(document_prefix(options.output_prefix, key));

  const std::vector<JsonlRange> ranges = plan_jsonl_partitions(options.input, options.partitions);
  const int k_parts = static_cast<int>(ranges.size());
  const std::vector<std::vector<std::string>> part_prefixes = partition_prefixes(options, k_parts);
  // After a failure: the partitions' intermediate datasets go; the outputs' writers have removed their
  // temporary files, and a dataset already at an output prefix is left as it was.
  const auto remove_intermediate = [&] {
    if (k_parts == 1) return;
    for (const auto& prefixes : part_prefixes) {
      for (const auto& prefix : prefixes) remove_dataset(prefix);
    }
  };

  RunState run(options, log, summary.input_bytes);
  std::vector<PartitionTotals> totals(ranges.size());
  try {
    if (k_parts == 1) {
      PartitionRun part(run, make_tokenizer, ranges[0], part_prefixes[0], summary.dtype, options.workers);
      totals[0] = part.run();
    } else {
      run_partitions(run, make_tokenizer, ranges, part_prefixes, summary.dtype, totals);
      merge_partitions(part_prefixes, summary.output_prefixes, options.json_keys.size(), summary.dtype);
    }
  } catch (...) {
    remove_intermediate();
    throw;
  }
  run.finish_progress();
  add_totals(totals, options.json_keys.size(), summary);
  summary.seconds = run.elapsed();
  return summary;
}

}  // namespace megatron::data
