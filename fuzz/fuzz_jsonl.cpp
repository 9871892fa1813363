// Fuzz target: jsonl input of preprocess_data: the JSON field reader on every line, the line reader over
// partitions of the file, and the whole pipeline (NullTokenizer: ids are the integers of the text).
// Input: the jsonl file. Oracles: the lines the range readers return, in order over any number of
// partitions, are the file's '\n'-separated lines; a line the field reader accepts has the types it reports;
// the pipeline either refuses the input (--strict) or writes a dataset that reads back, and what it logs
// holds no raw control bytes.
#include <cstdlib>
#include <sstream>

#include "fuzz_support.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/json_fields.h"
#include "megatron/data/jsonl_reader.h"
#include "megatron/data/preprocess_data.h"
#include "megatron/data/tokenizers/null_tokenizer.h"

using namespace megatron;

namespace {

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
  }
  return lines;
}

void check_fields(std::string_view line) {
  static const std::vector<std::string> keys = {"text", "title"};
  const data::JsonFieldsResult r = data::parse_json_fields(line, keys);
  if (!r.ok) {
    if (r.error.empty() || r.error_offset > line.size()) std::abort();
    return;
  }
  if (r.fields.size() != keys.size()) std::abort();
  for (const data::JsonField& f : r.fields)
    if ((f.kind == data::JsonField::Kind::String && f.values.size() != 1) ||
        (f.kind == data::JsonField::Kind::OtherType && f.type_name.empty()))
      std::abort();
}

void check_partitions(const std::string& path, const std::vector<std::string_view>& expected, int partitions) {
  size_t next = 0;
  for (const data::JsonlRange& range : data::plan_jsonl_partitions(path, partitions)) {
    data::JsonlRangeReader reader(path, range, 64);
    data::LineBatch batch;
    while (reader.next_batch(batch, 100, 3))
      for (size_t i = 0; i < batch.lines.size(); ++i) {
        if (next >= expected.size() || batch.line(i) != expected[next] ||
            batch.lines[i].line_number != int64_t(next) + 1)
          std::abort();
        ++next;
      }
  }
  if (next != expected.size()) std::abort();
}

void run_pipeline(const std::string& path, bool strict) {
  data::PreprocessOptions o;
  o.input = path;
  o.json_keys = {"text", "title"};
  o.output_prefix = (fuzz::scratch_dir() / "out").string();
  o.append_eod = true;
  o.strict = strict;
  o.log_interval = 0;
  std::ostringstream log;
  fuzz::expect_clean_rejection([&] {
    const data::PreprocessSummary s =
        data::preprocess_jsonl(o, [] { return std::make_unique<data::NullTokenizer>(1000); }, log);
    for (const std::string& prefix : s.output_prefixes) {
      data::IndexedDatasetReader reader(prefix);
      if (reader.num_documents() != s.documents) std::abort();
    }
  });
  fuzz::check_message(log.str().c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  const std::string path = (fuzz::scratch_dir() / "input.jsonl").string();
  fuzz::write_file(path, text);
  const std::vector<std::string_view> lines = lines_of(text);
  for (std::string_view line : lines) check_fields(line);
  for (int partitions : {1, 3}) check_partitions(path, lines, partitions);
  run_pipeline(path, size % 2 == 0);
  return 0;
}
