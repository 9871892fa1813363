// Bad tokenizer files found by the fuzz targets or by review: each refused with a megatron::Error naming the
// file, the entry and the constraint -- never a narrowed id, an overflow, a table as large as a rank a file
// claims, or another exception type.
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "harness.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tokenizer_available("GPT2BPETokenizer")) GTEST_SKIP() << "this build has no PCRE2 tokenizers";
    dir_ = testing::make_temp_dir("tokenizer_files");
  }
  fs::path dir_;
};

// Every byte's base64 with rank = the byte, as tiktoken's files start.
std::string byte_ranks() {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (int b = 0; b < 256; ++b) {
    out += digits[b >> 2];
    out += digits[(b & 3) << 4];
    out += "== " + std::to_string(b) + "\n";
  }
  return out;
}

TEST_F(TokenizerFiles, Gpt2IdsOutsideInt32AreRefused) {
  write(dir_ / "merges.txt", "#version: 0.2\n");
  write(dir_ / "vocab.json", R"({"a": 0, "b": 3000000000})");
  testing::expect_error(
      [&] { make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = (dir_ / "vocab.json").string(),
                            .merge_file = (dir_ / "merges.txt").string()}); },
      {"vocab.json", "the id of \"b\" is not an integer in [0, 2^31 - 1), got \"3000000000\""});
  // An id within int32 but far beyond the tokens would size the id table: refused too.
  write(dir_ / "vocab.json", R"({"a": 0, "b": 2000000000})");
  testing::expect_error(
      [&] { make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = (dir_ / "vocab.json").string(),
                            .merge_file = (dir_ / "merges.txt").string()}); },
      {"merges.txt: merge", "the largest token id 2000000000 is far beyond the 2 tokens"});
  write(dir_ / "vocab.json", R"({"a": 0, "b": 1})");
  write(dir_ / "merges.txt", "a\x1b[2Jb\n");
  testing::expect_error(
      [&] { make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = (dir_ / "vocab.json").string(),
                            .merge_file = (dir_ / "merges.txt").string()}); },
      {"merges.txt:1: a merge must be two tokens separated by one space, got \"a\\x1b[2Jb\""});
  write(dir_ / "vocab.json", R"({"a": 0, "b": -5e999})");  // beyond a double: the fuzzer's finding
  testing::expect_error(
      [&] { make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = (dir_ / "vocab.json").string(),
                            .merge_file = (dir_ / "merges.txt").string()}); },
      {"vocab.json: JSON not readable", "number overflow"});
}

TEST_F(TokenizerFiles, HuggingFaceAddedTokenIdsStayBelowInt32Max) {
  write(dir_ / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "added_tokens": [{"id": 2147483647, "content": "<x>"}]})");
  testing::expect_error([&] { make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = (dir_ / "tokenizer.json").string()}); },
                        {"tokenizer.json: added_tokens[0].id: token id 2147483647 is outside [0, 2^31 - 1)"});
  write(dir_ / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a\u001b": -1}, "merges": []}})");
  testing::expect_error([&] { make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = (dir_ / "tokenizer.json").string()}); },
                        {"model.vocab.\"a\\x1b\": token id -1 is outside"});
  // A number beyond a double ends nlohmann's parse with out_of_range, not parse_error (the fuzzer's finding).
  write(dir_ / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 1e400}, "merges": []}})");
  testing::expect_error([&] { make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = (dir_ / "tokenizer.json").string()}); },
                        {"tokenizer.json: JSON not readable", "number overflow"});
}

TEST_F(TokenizerFiles, TiktokenRanksFarBeyondTheFileAndNonListJsonAreRefused) {
  write(dir_ / "ranks", byte_ranks() + "YWI= 2000000000\n");
  testing::expect_error([&] { make_tokenizer({.type = "TikTokenizer", .tokenizer_model = (dir_ / "ranks").string()}); },
                        {"ranks: rank 2000000000 is far beyond the 257 ranks of the file"});
  write(dir_ / "ranks", R"({"rank": 0, "token_bytes": "IQ=="})");
  testing::expect_error([&] { make_tokenizer({.type = "TikTokenizer", .tokenizer_model = (dir_ / "ranks").string()}); },
                        {"ranks: a JSON ranks file must be a list", "it is object"});
  // A negative rank once sized the rank table from -1 (the fuzzer's finding at 958,686 inputs).
  write(dir_ / "ranks", R"([{"rank": 0, "token_bytes": "IQ=="}, {"rank": -2, "token_bytes": "Ig=="}])");
  testing::expect_error([&] { make_tokenizer({.type = "TikTokenizer", .tokenizer_model = (dir_ / "ranks").string()}); },
                        {"ranks: [1].rank: a rank must not be negative, got -2"});
  write(dir_ / "ranks", byte_ranks() + "!!\x07 300\n");
  testing::expect_error([&] { make_tokenizer({.type = "TikTokenizer", .tokenizer_model = (dir_ / "ranks").string()}); },
                        {"ranks:257: invalid base64 \"!!\\x07\""});
}

// A sentencepiece ModelProto in protobuf's wire format: pieces (field 1) of {piece (1), score (2), type (3)},
// plus `extra` bytes appended as they are.
std::string spm_model(const std::vector<std::string>& pieces, const std::string& extra = "") {
  auto length = [](size_t n) {  // a varint
    std::string out;
    do {
      out += char((n & 0x7F) | (n > 0x7F ? 0x80 : 0));
      n >>= 7;
    } while (n > 0);
    return out;
  };
  std::string model;
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::string piece = "\x0a" + length(pieces[i].size()) + pieces[i];
    piece += std::string("\x15\x00\x00\x80\xbf", 5);            // score -1.0f
    piece += std::string("\x18") + char(i == 0 ? 2 : 1);           // <unk> is UNKNOWN, the rest NORMAL
    model += "\x0a" + length(piece.size()) + piece;
  }
  return model + extra;
}

// libsentencepiece ends the process (its trie builder throws through the library) on a piece that holds a NUL
// byte -- the fuzzer's finding -- or is empty: both refused before the library sees them. The check walks
// groups and unknown fields as protobuf allows, and leaves malformed bytes to the library's own status.
TEST(SentencePieceModelFile, PiecesTheLibraryCannotHoldAreRefusedByIndex) {
  if (!tokenizer_available("SentencePieceTokenizer")) GTEST_SKIP() << "this build has no sentencepiece";
  const fs::path dir = testing::make_temp_dir("spm_model");
  const std::string path = (dir / "tokenizer.model").string();
  auto load = [&] { make_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = path}); };
  write(path, spm_model({"<unk>", "a", std::string("b\0c", 3)}));
  testing::expect_error(load, {"tokenizer.model: piece 2 (\"b\\x00c\") holds a NUL byte"});
  write(path, spm_model({"<unk>", "", "a"}));
  testing::expect_error(load, {"tokenizer.model: piece 1 is empty"});
  // After a group (field 5, wire types 3 and 4) holding a nested group and a varint: still seen.
  const std::string group = std::string("\x2b\x33\x08\x01\x34\x2c", 6);
  write(path, group + spm_model({"<unk>", std::string(1, '\0')}));
  testing::expect_error(load, {"piece 1", "holds a NUL byte"});
  // Groups nested deeper than protobuf's own limit (100) end the walk without recursion, however deep (here
  // 200,000 levels in 1.2 MB); the library refuses them with its status, the NUL piece after them unread.
  std::string deep;
  for (int i = 0; i < 200000; ++i) deep += "\x2b";  // open group 5
  for (int i = 0; i < 200000; ++i) deep += "\x2c";  // close it
  write(path, spm_model({"<unk>"}) + deep + spm_model({"<unk>", std::string(1, '\0')}));
  testing::expect_error(load, {"SentencePieceTokenizer: cannot load", "tokenizer.model"});
  testing::expect_error([&] { make_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = dir.string()}); },
                        {"SentencePieceTokenizer: ", "spm_model is not a regular file"});
  testing::expect_error([&] { make_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = path + ".missing"}); },
                        {"tokenizer.model.missing: no such file"});
  // Malformed bytes (a length past the end) are the library's to refuse, with its status.
  write(path, spm_model({"<unk>", "a"}) + "\x0a\x7f");
  testing::expect_error(load, {"SentencePieceTokenizer: cannot load", "tokenizer.model"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megatron::data
