// preprocess_data's pipeline: a jsonl file -> Megatron indexed datasets <prefix>_<key>_document.{bin,idx}.
//
// Contract:
// - Output: one dataset per json key, in Megatron's format, dtype by Megatron's rule on the tokenizer's
//   vocabulary size. Each written line is one document in every key's dataset; a string value is one
//   sequence, a list of strings one sequence per non-empty element (Megatron's sentences); with
//   append_eod the tokenizer's eod ends a non-empty document. An empty document is, as in Megatron, a
//   document of no sequences (no eod); with keep_empty it is one sequence: [eod] (append_eod) or empty,
//   so that every key keeps one sequence per written line.
// - Order: documents appear in input order whatever `workers` and `partitions` are; the outputs are
//   byte-identical across them. partitions = K splits the input into K line-aligned byte ranges processed
//   concurrently into <prefix>_<k>_<key>_document, then merged in order into the final datasets and
//   removed (Megatron's scheme, without copying the input).
// - Memory is constant in the input size: a reader hands batches of lines to the workers (each with its
//   own tokenizer) and at most a fixed window of batches is in flight; results are re-ordered by batch
//   number before writing. Memory grows only with the longest line.
// - Bad lines (LineIssue) are reported to `log` with the input path, line number, byte offset and the
//   line's first 80 bytes (at most max_reports per kind, then counted only) and skipped; under `strict`
//   a fatal kind throws megatron::Error instead. Empty documents and invalid UTF-8 (replaced by the
//   tokenizer as Python's errors="replace") are warnings, never fatal. Blank lines are skipped silently.
// - On any exception (a bad line under strict, a full disk, ...) the outputs are as they were before the run:
//   a dataset already at an output prefix stays complete and readable, and the run's temporary and
//   intermediate files are removed. The new datasets replace the old ones only once every key's files are
//   complete (IndexedDatasetWriter's prepare, then commit), so an .idx at an output prefix always
//   describes a complete run.
// - Progress: every log_interval written documents, one line to `log`: documents, docs/s, MB/s (MB =
//   2^20 bytes, as Megatron), percent of the input bytes and the ETA; on a terminal also a tqdm-style line on
//   stderr over the input's megabytes (core/progress.h; MEGATRON_PROGRESS=1 shows it in logs too).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "megatron/data/indexed_dataset.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

enum class LineIssue : int {
  kMalformedJson,   // not valid JSON, or not an object (fatal under strict)
  kMissingKey,      // a --json-keys key is absent (fatal under strict)
  kWrongType,       // a key's value is neither a string nor a list of strings (fatal under strict)
  kTokenizerError,  // the tokenizer refused the text, e.g. NullTokenizer on a non-integer (fatal under strict)
  kEmptyDocument,   // a key's document has no tokens (warning; counted per key)
  kInvalidUtf8,     // ill-formed UTF-8 replaced by U+FFFD (warning; counted per key)
  kBlankLine,       // whitespace only (skipped silently)
};
inline constexpr int kNumLineIssues = 7;
const char* line_issue_name(LineIssue issue);
bool line_issue_skips_line(LineIssue issue);  // the line writes no document (and strict stops)

struct PreprocessOptions {
  std::string input;
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  bool append_eod = false;
  bool keep_empty = false;
  bool strict = false;
  int workers = 1;
  int partitions = 1;
  int64_t log_interval = 1000;  // <= 0: no progress lines
  int max_reports = 20;         // per issue kind
  size_t batch_bytes = size_t{256} << 10;
  size_t batch_lines = 256;
};

struct PreprocessSummary {
  int64_t input_bytes = 0;
  int64_t lines = 0;
  int64_t documents = 0;  // written lines (one document per key each)
  std::array<int64_t, kNumLineIssues> issues{};
  std::vector<int64_t> tokens;  // per key, eod included
  TokenDType dtype = TokenDType::U16;
  std::vector<std::string> output_prefixes;  // per key: <prefix>_<key>_document
  double seconds = 0;
  int64_t skipped_lines() const;
};

using TokenizerFactory = std::function<std::unique_ptr<Tokenizer>()>;

// <output_prefix>_<key>_document
std::string document_prefix(const std::string& output_prefix, const std::string& key);

// Runs the whole conversion. `make_tokenizer` is called once up front (vocabulary size, eod) and once per
// worker thread. Throws megatron::Error on bad options, I/O errors and strict violations.
PreprocessSummary preprocess_jsonl(const PreprocessOptions& options, const TokenizerFactory& make_tokenizer,
                                   std::ostream& log);

}  // namespace megatron::data
