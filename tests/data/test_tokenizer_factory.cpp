// The --tokenizer-type factory in every build: NullTokenizer (which needs no third-party library), the flags
// each type needs, unknown types, and, for a type whose library this build lacks, an error that names the
// missing dependency instead of a link error or a silent fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/error.h"
#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {
namespace {

TEST(TokenizerFactory, NullTokenizer) {
  EXPECT_TRUE(tokenizer_available("NullTokenizer"));
  const auto t = make_tokenizer({.type = "NullTokenizer", .vocab_size = 100});
  EXPECT_EQ(t->encode(" 1 2\t\n99  0 "), (std::vector<int32_t>{1, 2, 99, 0}));
  EXPECT_EQ(t->decode({5, 6, 7}), "5 6 7");
  EXPECT_EQ(t->vocab_size(), 101);
  EXPECT_EQ(t->eod(), 100);
  testing::expect_error([&] { t->encode("1 x 2"); }, {"NullTokenizer", "\"x\"", "at byte 2"});
  testing::expect_error([&] { t->encode("101"); }, {"NullTokenizer", "\"101\"", "[0, 101)"});
  testing::expect_error([] { make_tokenizer({.type = "NullTokenizer"}); }, {"NullTokenizer", "--vocab-size"});
}

TEST(TokenizerFactory, UnknownTypeListsTheSupportedOnes) {
  EXPECT_FALSE(tokenizer_available("NoSuchTokenizer"));
  testing::expect_error([] { make_tokenizer({.type = "NoSuchTokenizer"}); },
                        {"unknown --tokenizer-type \"NoSuchTokenizer\"", "GPT2BPETokenizer", "NullTokenizer"});
}

// A type of an optional family: in a build that has it, the factory asks for the type's files; in one that
// does not, it names what the build lacks (PCRE2 / nlohmann_json, or sentencepiece) and how to get it.
TEST(TokenizerFactory, OptionalTypesNeedTheirFilesOrNameTheMissingLibrary) {
  struct Case {
    const char* type;
    const char* needs;                  // the flag asked for when the family is built
    std::vector<std::string> libraries;  // one of these is named when it is not
  };
  const std::vector<Case> cases = {
      {"GPT2BPETokenizer", "--vocab-file", {"PCRE2", "nlohmann_json"}},
      {"HuggingFaceTokenizer", "--tokenizer-model", {"PCRE2", "nlohmann_json"}},
      {"TikTokenizer", "--tokenizer-model", {"PCRE2", "nlohmann_json"}},
      {"Llama3Tokenizer", "--tokenizer-model", {"PCRE2", "nlohmann_json"}},
      {"SentencePieceTokenizer", "--tokenizer-model", {"sentencepiece"}},
      {"GPTSentencePieceTokenizer", "--tokenizer-model", {"sentencepiece"}},
      {"Llama2Tokenizer", "--tokenizer-model", {"sentencepiece"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.type);
    const std::string prefix = std::string("--tokenizer-type ") + c.type;
    if (tokenizer_available(c.type)) {
      testing::expect_error([&] { make_tokenizer({.type = c.type}); }, {prefix, "needs", c.needs});
      continue;
    }
    try {
      make_tokenizer({.type = c.type});
      ADD_FAILURE() << c.type << " was built although tokenizer_available() says it is not";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(prefix + ": this build has no "), std::string::npos) << message;
      EXPECT_NE(message.find("reconfigure"), std::string::npos) << message;
      bool named = false;
      for (const std::string& library : c.libraries) named = named || message.find(library) != std::string::npos;
      EXPECT_TRUE(named) << message;
    }
  }
}

// Standard base64 with padding (tiktoken's ranks files).
std::string base64(const std::string& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? uint8_t(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? digits[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// --tokenizer-type Llama3Tokenizer: a tiktoken ranks file (Llama 3's tokenizer.model format) followed by Llama
// 3.1's 256 special tokens, as Meta's tokenizer.py and transformers' tokenizer.json number them: with Llama 3's
// 128000 ranks, <|begin_of_text|> 128000 (bos), <|end_of_text|> 128001 (end of document), <|finetune_right_pad_id|>
// 128004, <|eot_id|> 128009, <|python_tag|> 128010, <|reserved_special_token_3|> 128011 ...
// <|reserved_special_token_247|> 128255. Here the file has 257 ranks (every byte and "ab"), so ids are 257 + k.
TEST(TokenizerFactory, Llama3TokenizerHasLlama3sSpecialTokens) {
  if (!tokenizer_available("Llama3Tokenizer")) GTEST_SKIP() << "built without PCRE2";
  const std::filesystem::path dir = testing::make_temp_dir("llama3_tokenizer");
  {
    std::ofstream ranks(dir / "tokenizer.model");
    for (int b = 0; b < 256; ++b) ranks << base64(std::string(1, char(b))) << " " << b << "\n";
    ranks << base64("ab") << " 256\n";
  }
  const auto t = make_tokenizer({.type = "Llama3Tokenizer", .tokenizer_model = (dir / "tokenizer.model").string()});
  const int32_t first = 257;
  EXPECT_EQ(t->vocab_size(), first + 256);
  EXPECT_EQ(t->bos(), first);
  EXPECT_EQ(t->eod(), first + 1);
  EXPECT_EQ(t->decode({first}), "<|begin_of_text|>");
  EXPECT_EQ(t->decode({first + 1}), "<|end_of_text|>");
  EXPECT_EQ(t->decode({first + 4}), "<|finetune_right_pad_id|>");
  EXPECT_EQ(t->decode({first + 6}), "<|start_header_id|>");
  EXPECT_EQ(t->decode({first + 9}), "<|eot_id|>");
  EXPECT_EQ(t->decode({first + 10}), "<|python_tag|>");
  EXPECT_EQ(t->decode({first + 11}), "<|reserved_special_token_3|>");
  EXPECT_EQ(t->decode({first + 255}), "<|reserved_special_token_247|>");
  // Llama 3's pattern cuts "ab ab" into "ab" and " ab"; " ab" has no rank: its bytes merge to ' ' + "ab".
  EXPECT_EQ(t->encode("ab ab"), (std::vector<int32_t>{256, ' ', 256}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megatron::data
