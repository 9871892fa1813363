// preprocess_data: jsonl -> Megatron indexed datasets <output-prefix>_<key>_document.{bin,idx}, with
// Megatron's flags (tools/preprocess_data.py). The pipeline is megatron::data::preprocess_jsonl
// (src/megatron/data/preprocess_data.h); this file parses flags and prints the summary.
// Exit status: 0 done; 1 an error (bad options, I/O, a bad line under --strict) with no .idx left behind;
// 2 a command-line syntax error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "megatron/core/error.h"
#include "megatron/data/preprocess_data.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace {

using megatron::data::LineIssue;

void print_summary(const megatron::data::PreprocessOptions& o, const megatron::data::PreprocessSummary& s) {
  const double mb = static_cast<double>(s.input_bytes) / (1 << 20);
  const double t = s.seconds > 0 ? s.seconds : 1e-9;
  const auto issue = [&](LineIssue i) { return static_cast<long long>(s.issues[static_cast<size_t>(i)]); };
  std::printf("preprocess_data: done in %.2f s: %.2f MB in, %.2f MB/s, %.1f docs/s\n", s.seconds, mb, mb / t,
              static_cast<double>(s.documents) / t);
  std::printf("  lines read:        %lld\n", static_cast<long long>(s.lines));
  std::printf("  documents written: %lld (per key)\n", static_cast<long long>(s.documents));
  std::printf("  skipped lines:     %lld (malformed JSON %lld, missing key %lld, wrong value type %lld, "
              "tokenizer error %lld, blank %lld)\n",
              static_cast<long long>(s.skipped_lines()), issue(LineIssue::kMalformedJson),
              issue(LineIssue::kMissingKey), issue(LineIssue::kWrongType), issue(LineIssue::kTokenizerError),
              issue(LineIssue::kBlankLine));
  std::printf("  empty documents:   %lld%s\n", issue(LineIssue::kEmptyDocument),
              o.keep_empty ? " (kept as one sequence: --keep-empty)" : " (written with no sequence, as Megatron)");
  std::printf("  invalid UTF-8:     %lld (replaced by U+FFFD)\n", issue(LineIssue::kInvalidUtf8));
  for (size_t k = 0; k < s.output_prefixes.size(); ++k) {
    std::printf("  %s.{bin,idx}: %lld tokens, %s\n", s.output_prefixes[k].c_str(),
                static_cast<long long>(s.tokens[k]), megatron::data::token_dtype_name(s.dtype));
  }
}

}  // namespace

int main(int argc, char** argv) {
  megatron::data::PreprocessOptions o;
  megatron::data::TokenizerConfig tok;
  int64_t vocab_size = -1;
  bool split_sentences = false, keep_newlines = false, keep_sequential = false;
  std::string lang, dataset_impl = "mmap";

  CLI::App app{"Tokenizes a jsonl file into Megatron indexed datasets <output-prefix>_<key>_document.{bin,idx}."};
  app.option_defaults()->always_capture_default();
  auto* input = app.add_option_group("input data");
  input->add_option("--input", o.input, "Path to the input jsonl file")->required();
  input->add_option("--json-keys", o.json_keys, "Keys to extract from each JSON line (one dataset each)")
      ->expected(1, 1 << 20);
  input->add_flag("--split-sentences", split_sentences, "Not supported (needs NLTK's punkt)");
  input->add_flag("--keep-newlines", keep_newlines, "Only with --split-sentences (not supported)");
  auto* tokenizer = app.add_option_group("tokenizer");
  tokenizer->add_option("--tokenizer-type", tok.type,
                        "GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer, "
                        "GPTSentencePieceTokenizer or NullTokenizer")
      ->required();
  tokenizer->add_option("--vocab-file", tok.vocab_file, "GPT2BPETokenizer: vocab.json");
  tokenizer->add_option("--merge-file", tok.merge_file, "GPT2BPETokenizer: merges.txt");
  tokenizer->add_option("--tokenizer-model", tok.tokenizer_model,
                        "HuggingFace tokenizer.json (or its folder), tiktoken ranks file or sentencepiece .model");
  tokenizer->add_option("--vocab-size", vocab_size, "NullTokenizer: ids are < this (eod = this)");
  tokenizer->add_option("--tiktoken-pattern", tok.tiktoken_pattern, "TikTokenizer: v1/gpt2, v2/llama3, qwen2 or a regex");
  tokenizer->add_option("--tiktoken-num-special-tokens", tok.tiktoken_num_special_tokens,
                        "TikTokenizer: Megatron's special-token layout when > 0");
  tokenizer->add_option("--tiktoken-special-tokens", tok.tiktoken_special_tokens, "TikTokenizer: special tokens");
  auto* process = app.add_option_group("tokenization process");
  process->add_flag("--append-eod", o.append_eod, "Append the tokenizer's eod to every non-empty document");
  process->add_option("--lang", lang, "Only with --split-sentences (not supported)");
  process->add_flag("--keep-empty", o.keep_empty,
                    "Write an empty document as one sequence ([eod] with --append-eod) instead of none");
  process->add_flag("--strict", o.strict,
                    "Stop (exit 1, no .idx) at the first malformed line, missing key, wrong value type or "
                    "tokenizer error instead of skipping it");
  auto* output = app.add_option_group("output data");
  output->add_option("--output-prefix", o.output_prefix, "Output prefix (writes <prefix>_<key>_document.{bin,idx})")
      ->required();
  output->add_option("--dataset-impl", dataset_impl, "Accepted for old scripts; only mmap");
  auto* runtime = app.add_option_group("runtime");
  // Integer ranges, not CLI::PositiveNumber: its message for 0 is "not in range 0.000000 to 1.79e308" (a
  // double's bounds printed in full), and a million threads or partition files is a typo, not a plan.
  runtime->add_option("--workers", o.workers, "Tokenizer threads (shared out over the partitions)")
      ->check(CLI::Range(1, 4096));
  runtime->add_option("--partitions", o.partitions,
                      "Split the input into this many line-aligned byte ranges, processed concurrently and merged")
      ->check(CLI::Range(1, 4096));
  runtime->add_option("--log-interval", o.log_interval, "Progress line every this many documents (0: none)");
  runtime->add_flag("--keep-sequential-samples", keep_sequential,
                    "Accepted for Megatron's scripts; input order is always kept");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    MEGATRON_CHECK(!split_sentences && !keep_newlines && lang.empty(),
                   "--split-sentences (and --keep-newlines, --lang) are not supported: they need NLTK's punkt; "
                   "preprocess without them (one sequence per document)");
    MEGATRON_CHECK(dataset_impl == "mmap", "--dataset-impl ", dataset_impl, " is not supported (only mmap)");
    if (vocab_size >= 0) tok.vocab_size = vocab_size;
    std::cerr << "Opening " << o.input << " (" << o.workers << " worker" << (o.workers == 1 ? "" : "s") << ", "
              << o.partitions << " partition" << (o.partitions == 1 ? "" : "s") << ")" << std::endl;
    const auto summary = megatron::data::preprocess_jsonl(
        o, [&tok] { return megatron::data::make_tokenizer(tok); }, std::cerr);
    print_summary(o, summary);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "preprocess_data: error: " << e.what() << std::endl;
    return 1;
  }
}
