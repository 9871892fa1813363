// preprocess_data and merge_datasets, run as built executables on jsonl files written here.
//
// tests/data/preprocess/make_bpe.py (one python3 call per suite) trains a GPT-2-style byte-level BPE on the
// corpus, writes vocab.json/merges.txt and the ids the `tokenizers` package gives for every document. The
// tool's .bin/.idx must hold exactly those ids (+ eod) and be byte-identical across --workers and
// --partitions; bad lines are reported with their line number and counted; --strict stops with exit 1 and
// no .idx; the merge of two runs equals one run over the concatenated input. (Suite PreprocessData: builds
// with the PCRE2 tokenizers only.)
//
// Suite PreprocessDataNullTokenizer runs in every build, those without PCRE2 included: NullTokenizer ids,
// bad options, and pretrain_gpt training a few iterations on what preprocess_data wrote.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cmath>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "megatron/data/indexed_dataset.h"
#include "megatron/data/tokenizers/tokenizer.h"
#include "temp_dirs.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;

#if defined(PREPROCESS_DATA_EXE) && defined(MERGE_DATASETS_EXE)
constexpr const char* kPreprocess = PREPROCESS_DATA_EXE;
constexpr const char* kMerge = MERGE_DATASETS_EXE;
#else
constexpr const char* kPreprocess = nullptr;
constexpr const char* kMerge = nullptr;
#endif
#ifdef PRETRAIN_GPT_EXE
constexpr const char* kPretrain = PRETRAIN_GPT_EXE;
#else
constexpr const char* kPretrain = nullptr;
#endif

struct RunResult {
  int rc = -1;
  std::string output;  // stdout and stderr
};

RunResult run(const std::string& command) {
  RunResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Documents of a dataset: each the concatenation of its sequences.
std::vector<std::vector<int64_t>> documents(const std::string& prefix) {
  const IndexedDatasetReader reader(prefix);
  std::vector<std::vector<int64_t>> docs;
  const auto d = reader.document_indices();
  for (size_t i = 0; i + 1 < d.size(); ++i) {
    std::vector<int64_t> doc;
    for (int64_t s = d[i]; s < d[i + 1]; ++s) {
      const auto ids = reader.get(s);
      doc.insert(doc.end(), ids.begin(), ids.end());
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::vector<std::vector<int64_t>> read_expected(const fs::path& p, int64_t eod) {
  std::vector<std::vector<int64_t>> docs;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int64_t> ids{std::istream_iterator<int64_t>(words), std::istream_iterator<int64_t>()};
    if (!ids.empty() && eod >= 0) ids.push_back(eod);
    docs.push_back(std::move(ids));
  }
  return docs;
}

// Varied documents: scripts, emoji, whitespace runs, digits, contractions, JSON escapes (written by
// json_quote, plus \u escapes of a BMP character and a surrogate pair in some lines).
std::vector<std::pair<std::string, std::string>> corpus_lines(int n, uint32_t seed) {
  static const std::vector<std::string> atoms = {
      "the", " The", " quick", " fox", "'s", " isn't", " we're", " Café", " naïve", " Ёжик", " ещё", " αβγ",
      " 東京", "我能", " 한국어", " مرحبا", " नमस्ते", " 😀", "👍🏽", " 👨‍👩‍👧", " 🇫🇷", " ", "  ", "   ", "\t", "\n",
      "\n\n", " 0", " 7", " 42", " 2024", " 1234567", " 3.14", ",", ".", "!!", " ?", " (", ")", " {", "}", " ==",
      " ->", " //", " #", "_", "-", " \"quoted\"", " back\\slash", " tokens", " merge", " byte", " pair"};
  std::mt19937 rng(seed);
  std::vector<std::pair<std::string, std::string>> out;
  for (int i = 0; i < n; ++i) {
    std::string text, title = std::to_string(i);
    title.insert(title.begin(), 'T');  // (not "T" + ...: GCC 12 warns falsely, -Wrestrict)
    const int words = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < words; ++k) text += atoms[rng() % atoms.size()];
    for (int k = 0; k < 3; ++k) title += atoms[rng() % atoms.size()];
    out.emplace_back(text, title);
  }
  return out;
}

std::string jsonl(const std::vector<std::pair<std::string, std::string>>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string text = json_quote(lines[i].first);
    if (i % 7 == 3) text.insert(text.size() - 1, " \\u00e9\\ud83d\\ude00");  // é 😀 as escapes
    out += "{\"id\": " + std::to_string(i) + ", \"text\": " + text + ", \"meta\": {\"n\": [1, 2.5e3, null, true]}, " +
           "\"title\": " + json_quote(lines[i].second) + "}\n";
  }
  return out;
}

bool have_gpt2() { return tokenizer_available("GPT2BPETokenizer"); }

class PreprocessData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (kPreprocess == nullptr || !have_gpt2()) return;
    dir_ = new fs::path(megatron::testing::make_temp_dir("preprocess"));
    write_file(*dir_ / "corpus.jsonl", jsonl(corpus_lines(1500, 7)));
    const std::string cmd = "python3 " + (fs::path(MEGATRON_TESTS_SOURCE_DIR) / "data" / "preprocess" / "make_bpe.py").string() +
                            " " + dir_->string() + " " + (*dir_ / "corpus.jsonl").string() + " 600 text title";
    const RunResult r = run(cmd);
    if (r.rc != 0) setup_error_ = new std::string("python reference failed (python3 + the tokenizers package are "
                                                  "required; scripts/deps.sh installs them): " + cmd + "\n" + r.output);
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete setup_error_;
    dir_ = nullptr;
    setup_error_ = nullptr;
  }
  void SetUp() override {
    if (kPreprocess == nullptr) GTEST_SKIP() << "preprocess_data is not built (needs CLI11)";
    if (!have_gpt2()) GTEST_SKIP() << "this build has no GPT2BPETokenizer (PCRE2)";
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
  }

  static fs::path dir() { return *dir_; }
  static std::string gpt2_flags() {
    return " --tokenizer-type GPT2BPETokenizer --vocab-file " + (dir() / "vocab.json").string() + " --merge-file " +
           (dir() / "merges.txt").string();
  }
  // Runs preprocess_data on `input` with output prefix dir()/name and extra flags.
  static RunResult preprocess(const fs::path& input, const std::string& name, const std::string& flags) {
    return run(std::string(kPreprocess) + " --input " + input.string() + " --output-prefix " + (dir() / name).string() +
               gpt2_flags() + " " + flags);
  }
  static std::string prefix(const std::string& name, const std::string& key = "text") {
    return (dir() / (name + "_" + key + "_document")).string();
  }
  static int64_t eod() {
    // <|endoftext|> is the trainer's first special token: id 0. Checked against vocab.json.
    const std::string vocab = read_file(dir() / "vocab.json");
    EXPECT_NE(vocab.find("\"<|endoftext|>\": 0"), std::string::npos) << vocab.substr(0, 200);
    return 0;
  }

  static fs::path* dir_;
  static std::string* setup_error_;
};

fs::path* PreprocessData::dir_ = nullptr;
std::string* PreprocessData::setup_error_ = nullptr;

TEST_F(PreprocessData, IdsEqualTokenizersPackageAndIdenticalAcrossWorkersAndPartitions) {
  const fs::path input = dir() / "corpus.jsonl";
  RunResult r = preprocess(input, "w1", "--append-eod --workers 1 --log-interval 500");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("Processed 1000 documents"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ETA"), std::string::npos) << r.output;
  const auto expected = read_expected(dir() / "expected_text.txt", eod());
  ASSERT_EQ(expected.size(), 1500u);
  const auto got = documents(prefix("w1"));
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "document " << i;
  // Megatron's dtype rule: a 600-entry vocabulary -> uint16 (code 8 at byte 17 of the .idx).
  EXPECT_EQ(static_cast<int>(read_file(prefix("w1") + ".idx")[17]), 8);
  EXPECT_EQ(IndexedDatasetReader(prefix("w1")).num_sequences(), 1500);

  const std::string bin = read_file(prefix("w1") + ".bin"), idx = read_file(prefix("w1") + ".idx");
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"w3", "--workers 3"}, {"p2", "--workers 2 --partitions 2"}, {"p3w1", "--workers 1 --partitions 3"},
           {"p2w3", "--workers 3 --partitions 2"}}) {
    r = preprocess(input, name, "--append-eod " + flags);
    ASSERT_EQ(r.rc, 0) << flags << "\n" << r.output;
    EXPECT_TRUE(read_file(prefix(name) + ".bin") == bin) << flags;
    EXPECT_TRUE(read_file(prefix(name) + ".idx") == idx) << flags;
    // Partition files are merged and removed.
    EXPECT_FALSE(fs::exists(dir() / (name + "_0_text_document.idx"))) << flags;
    EXPECT_FALSE(fs::exists(dir() / (name + "_0_text_document.bin"))) << flags;
  }
}

TEST_F(PreprocessData, TwoJsonKeys) {
  const RunResult r = preprocess(dir() / "corpus.jsonl", "keys", "--json-keys text title --workers 2");
  ASSERT_EQ(r.rc, 0) << r.output;
  for (const std::string key : {"text", "title"}) {
    const auto expected = read_expected(dir() / ("expected_" + key + ".txt"), -1);  // no --append-eod
    EXPECT_EQ(documents(prefix("keys", key)), expected) << key;
  }
}

TEST_F(PreprocessData, MalformedLineIsReportedWithItsLineNumberAndSkipped) {
  std::string text = jsonl(corpus_lines(40, 11));
  std::string lines;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    lines += (n == 30 ? std::string("{\"text\": \"unterminated, \"id\": 29") : line) + "\n";
  }
  write_file(dir() / "bad.jsonl", lines);
  RunResult r = preprocess(dir() / "bad.jsonl", "bad", "--workers 2 --append-eod");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:30 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("malformed JSON: Expecting ',' delimiter"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("{\"text\": \"unterminated"), std::string::npos) << r.output;  // the line's start
  EXPECT_NE(r.output.find("skipped lines:     1 (malformed JSON 1,"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("documents written: 39"), std::string::npos) << r.output;
  EXPECT_EQ(IndexedDatasetReader(prefix("bad")).num_documents(), 39);

  // The line number is the file's, also when the bad line lies in a later partition.
  r = preprocess(dir() / "bad.jsonl", "badp", "--workers 2 --partitions 3");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:30 "), std::string::npos) << r.output;

  // --strict: exit 1 naming the line, and no .idx (nor .bin) left.
  for (const std::string flags : {"--strict --workers 2", "--strict --workers 2 --partitions 2"}) {
    r = preprocess(dir() / "bad.jsonl", "strict", flags);
    EXPECT_EQ(r.rc, 1) << r.output;
    EXPECT_NE(r.output.find("bad.jsonl:30 "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--strict"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(prefix("strict") + ".idx")) << flags;
    EXPECT_FALSE(fs::exists(prefix("strict") + ".bin")) << flags;
    EXPECT_FALSE(fs::exists(dir() / "strict_0_text_document.idx")) << flags;
    EXPECT_FALSE(fs::exists(dir() / "strict_1_text_document.idx")) << flags;
  }
}

TEST_F(PreprocessData, MissingKeyEmptyDocumentAndInvalidUtf8AreCountedAndReported) {
  const std::string lines =
      "{\"text\": \"hello world\"}\n"          // 1
      "{\"title\": \"no text here\"}\n"        // 2 missing key
      "{\"text\": \"\"}\n"                     // 3 empty document
      "\n"                                     // 4 blank
      "{\"text\": \"abc \xFF\xFE def\"}\n"     // 5 invalid UTF-8
      "{\"text\": 42}\n"                       // 6 wrong type
      "[\"text\", \"not an object\"]\n"        // 7 malformed (not an object)
      "{\"text\": [\"two \", \"sentences\"]}\n"  // 8 a list: two sequences, one document
      "{\"text\": \"last line without newline\"}";
  write_file(dir() / "odd.jsonl", lines);
  RunResult r = preprocess(dir() / "odd.jsonl", "odd", "--append-eod");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:2 (byte 24): missing key: no key \"text\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:3 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("empty document"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:5 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("invalid UTF-8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:6 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"text\" is number"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:7 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skipped lines:     4 (malformed JSON 1, missing key 1, wrong value type 1, "
                          "tokenizer error 0, blank 1)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("empty documents:   1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("invalid UTF-8:     1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("documents written: 5"), std::string::npos) << r.output;

  // Megatron's layout: the empty document has no sequence (and no eod); the list gives two sequences.
  const IndexedDatasetReader reader(prefix("odd"));
  EXPECT_EQ(reader.num_documents(), 5);
  EXPECT_EQ(reader.num_sequences(), 5);
  EXPECT_EQ(std::vector<int64_t>(reader.document_indices().begin(), reader.document_indices().end()),
            (std::vector<int64_t>{0, 1, 1, 2, 4, 5}));
  EXPECT_EQ(reader.get(3).back(), eod());  // eod ends the document, after the last sentence
  EXPECT_NE(reader.get(2).back(), eod());

  // --keep-empty: the empty document is one sequence [eod].
  r = preprocess(dir() / "odd.jsonl", "keep", "--append-eod --keep-empty");
  ASSERT_EQ(r.rc, 0) << r.output;
  const IndexedDatasetReader kept(prefix("keep"));
  EXPECT_EQ(kept.num_sequences(), 6);
  EXPECT_EQ(kept.get(1), (std::vector<int64_t>{eod()}));

  // --strict stops at the missing key (line 2).
  r = preprocess(dir() / "odd.jsonl", "odd_strict", "--strict");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("odd.jsonl:2 "), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(prefix("odd_strict") + ".idx"));
}

TEST_F(PreprocessData, MergeOfTwoRunsEqualsOneRunOverTheConcatenation) {
  const auto lines = corpus_lines(300, 23);
  const std::vector<std::pair<std::string, std::string>> a(lines.begin(), lines.begin() + 120),
      b(lines.begin() + 120, lines.end());
  write_file(dir() / "a.jsonl", jsonl(a));
  write_file(dir() / "b.jsonl", jsonl(b));
  write_file(dir() / "ab.jsonl", jsonl(a) + jsonl(b));
  for (const std::string name : {"a", "b", "ab"}) {
    const RunResult r = preprocess(dir() / (name + ".jsonl"), "m_" + name, "--append-eod --workers 2");
    ASSERT_EQ(r.rc, 0) << r.output;
  }
  // ab.jsonl is a.jsonl followed by b.jsonl, byte for byte.
  RunResult r = run(std::string(kMerge) + " --input " + prefix("m_a") + " " + prefix("m_b") + " --output-prefix " +
                    (dir() / "merged").string());
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(read_file(dir() / "merged.bin") == read_file(prefix("m_ab") + ".bin"));
  EXPECT_TRUE(read_file(dir() / "merged.idx") == read_file(prefix("m_ab") + ".idx"));

  // A directory input: every pair in it, sorted by name.
  fs::create_directories(dir() / "parts");
  for (const std::string name : {"a", "b"}) {
    for (const std::string ext : {".bin", ".idx"}) {
      fs::copy_file(prefix("m_" + name) + ext, dir() / "parts" / (name + ext), fs::copy_options::overwrite_existing);
    }
  }
  r = run(std::string(kMerge) + " --input " + (dir() / "parts").string() + " --output-prefix " +
          (dir() / "merged_dir").string());
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(read_file(dir() / "merged_dir.idx") == read_file(prefix("m_ab") + ".idx"));

  // Mismatched dtypes are refused, naming each input's dtype; nothing is written.
  write_file(dir() / "ints.jsonl", "{\"text\": \"1 2 70000\"}\n");
  r = run(std::string(kPreprocess) + " --input " + (dir() / "ints.jsonl").string() + " --output-prefix " +
          (dir() / "ints").string() + " --tokenizer-type NullTokenizer --vocab-size 70000");
  ASSERT_EQ(r.rc, 0) << r.output;
  r = run(std::string(kMerge) + " --input " + prefix("m_a") + " " + prefix("ints") + " --output-prefix " +
          (dir() / "mixed").string());
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("different token dtypes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(prefix("ints") + ": int32"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir() / "mixed.idx"));
}

// NullTokenizer needs no third-party library: these run in every build.
class PreprocessDataNullTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kPreprocess == nullptr) GTEST_SKIP() << "preprocess_data is not built (needs CLI11)";
    dir_ = megatron::testing::make_temp_dir("preprocess_null");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  const fs::path& dir() const { return dir_; }
  std::string prefix(const std::string& name) const { return (dir_ / (name + "_text_document")).string(); }

  fs::path dir_;
};

TEST_F(PreprocessDataNullTokenizer, IdsEodAndBadLines) {
  write_file(dir() / "null.jsonl",
             "{\"text\": \"1 2 3\"}\n{\"text\": \" 99\\t0 \"}\n{\"text\": \"\"}\n{\"text\": \"4 x 5\"}\n{\"text\": \"7\"}\n");
  const std::string base = std::string(kPreprocess) + " --input " + (dir() / "null.jsonl").string() +
                           " --tokenizer-type NullTokenizer --vocab-size 100 --append-eod --output-prefix ";
  RunResult r = run(base + (dir() / "null").string());
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("null.jsonl:4 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer error 1"), std::string::npos) << r.output;
  EXPECT_EQ(documents(prefix("null")),
            (std::vector<std::vector<int64_t>>{{1, 2, 3, 100}, {99, 0, 100}, {}, {7, 100}}));
  EXPECT_EQ(static_cast<int>(read_file(prefix("null") + ".idx")[17]), 8);  // uint16

  r = run(base + (dir() / "null_strict").string() + " --strict");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_FALSE(fs::exists(prefix("null_strict") + ".idx"));
}

TEST_F(PreprocessDataNullTokenizer, BadOptionsAreErrors) {
  RunResult r = run(std::string(kPreprocess) + " --input " + (dir() / "missing.jsonl").string() + " --output-prefix " +
                    (dir() / "x").string() + " --tokenizer-type NullTokenizer --vocab-size 10");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("missing.jsonl"), std::string::npos) << r.output;
  write_file(dir() / "one.jsonl", "{\"text\": \"1 2\"}\n");
  r = run(std::string(kPreprocess) + " --input " + (dir() / "one.jsonl").string() + " --output-prefix " +
          (dir() / "x").string() + " --tokenizer-type NullTokenizer --vocab-size 10 --split-sentences");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("--split-sentences"), std::string::npos) << r.output;
  r = run(std::string(kPreprocess) + " --input x.jsonl");  // no --output-prefix / --tokenizer-type
  EXPECT_EQ(r.rc, 2) << r.output;
}

// What a build without PCRE2 must still do: tokenize pre-tokenised text with NullTokenizer into a dataset
// and train on it. pretrain_gpt takes its vocabulary from the tokenizer (the ids in use + eod).
TEST_F(PreprocessDataNullTokenizer, PretrainGptTrainsOnTheDataset) {
  if (kPretrain == nullptr) GTEST_SKIP() << "pretrain_gpt is not built";
  const int64_t vocab = 500;
  std::mt19937 rng(7);
  std::string lines;
  std::vector<std::vector<int64_t>> expected;
  for (int d = 0; d < 200; ++d) {
    std::vector<int64_t> ids(size_t(20 + rng() % 40));
    std::string text;
    for (int64_t& id : ids) {
      id = int64_t(rng() % uint32_t(vocab));
      text += std::to_string(id) + " ";
    }
    ids.push_back(vocab);  // --append-eod: NullTokenizer's eod is its --vocab-size
    expected.push_back(ids);
    lines += "{\"text\": \"" + text + "\"}\n";
  }
  write_file(dir() / "train.jsonl", lines);
  RunResult r = run(std::string(kPreprocess) + " --input " + (dir() / "train.jsonl").string() + " --output-prefix " +
                    (dir() / "train").string() + " --tokenizer-type NullTokenizer --vocab-size " +
                    std::to_string(vocab) + " --append-eod --workers 2");
  ASSERT_EQ(r.rc, 0) << r.output;
  ASSERT_EQ(documents(prefix("train")), expected);

  const int iterations = 3;
  r = run(std::string(kPretrain) + " --device cpu --num-layers 2 --hidden-size 32 --num-attention-heads 4 " +
          "--seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 " +
          "--attention-dropout 0 " +
          "--train-iters " + std::to_string(iterations) + " --log-interval 1 --eval-interval 1000 --eval-iters 1 " +
          "--split 90,5,5 --data-path " + prefix("train") + " --data-cache-path " + (dir() / "cache").string() +
          " --tokenizer-type NullTokenizer --vocab-size " + std::to_string(vocab));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("vocab_size \\.+ " + std::to_string(vocab + 1) + "\n")))
      << "the vocabulary is NullTokenizer's (ids and eod)\n" << r.output;
  const std::regex line(R"(iteration +(\d+)/ +(\d+) \|.*lm loss: ([^ |]+))");
  int logged = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line); it != std::sregex_iterator(); ++it) {
    ++logged;
    EXPECT_EQ(std::stoi((*it)[1]), logged) << r.output;
    EXPECT_EQ(std::stoi((*it)[2]), iterations) << r.output;
    const double loss = std::stod((*it)[3]);
    // Near ln(vocabulary) at the start: finite, and what a model choosing among ~500 ids would score.
    EXPECT_TRUE(std::isfinite(loss) && loss > 0.5 * std::log(double(vocab)) && loss < 2 * std::log(double(vocab)))
        << "iteration " << logged << ": lm loss " << loss << "\n" << r.output;
  }
  EXPECT_EQ(logged, iterations) << r.output;

  // Ids at or past the vocabulary are refused by name, not trained on.
  write_file(dir() / "bad.jsonl", "{\"text\": \"1 2 501\"}\n");
  r = run(std::string(kPreprocess) + " --input " + (dir() / "bad.jsonl").string() + " --output-prefix " +
          (dir() / "bad").string() + " --tokenizer-type NullTokenizer --vocab-size 500 --strict");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("\"501\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::data
