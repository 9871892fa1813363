// Packing conversations into rows of --seq-length + 1 tokens: next-fit in file order, the rest of a row padded,
// an overlong conversation cut to one row, tags = 2 * conversation-in-row + trained (padding -1); the jsonl
// forms (messages, prompt/response with an optional system, a system message starting a new conversation) and
// their errors naming file and line; --split dividing the lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "harness.h"
#include "megatron/data/sft/sft_dataset.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;

// A conversation of `n` tokens valued base, base + 1, ...; every other token trained.
ConversationTokens conversation(int n, int32_t base) {
  ConversationTokens c;
  for (int i = 0; i < n; ++i) {
    c.tokens.push_back(base + i);
    c.trained.push_back(uint8_t(i % 2));
  }
  return c;
}

TEST(SftPacking, NextFitInFileOrderWithPaddingAndTruncation) {
  // Capacity 8: [3, 4] | [2] | [10 -> cut to 8] | [1] | [8]; an empty conversation is skipped.
  const std::vector<ConversationTokens> cs = {conversation(3, 100), conversation(4, 200), conversation(2, 300),
                                              conversation(10, 400), conversation(0, 0), conversation(1, 500),
                                              conversation(8, 600)};
  const PackedConversations p = pack_conversations(cs, 7, -7);
  ASSERT_EQ(p.row_width, 16);
  ASSERT_EQ(p.rows(), 5);
  EXPECT_EQ(p.truncated, 1);
  const auto row = [&](int64_t r) {
    return std::vector<int64_t>(p.values.begin() + r * 16, p.values.begin() + (r + 1) * 16);
  };
  EXPECT_EQ(row(0), (std::vector<int64_t>{100, 101, 102, 200, 201, 202, 203, -7,  // tokens
                                          0, 1, 0, 2, 3, 2, 3, -1}));             // tags
  EXPECT_EQ(row(1), (std::vector<int64_t>{300, 301, -7, -7, -7, -7, -7, -7, 0, 1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(row(2), (std::vector<int64_t>{400, 401, 402, 403, 404, 405, 406, 407, 0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(row(3), (std::vector<int64_t>{500, -7, -7, -7, -7, -7, -7, -7, 0, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(row(4), (std::vector<int64_t>{600, 601, 602, 603, 604, 605, 606, 607, 0, 1, 0, 1, 0, 1, 0, 1}));
  // Reading wraps around, as the sample stream does.
  SftDataset d(p, 6);
  std::vector<int64_t> out(16);
  d.sample(7, out);
  EXPECT_EQ(out, row(2));
}

fs::path write_lines(const fs::path& dir, const std::vector<std::string>& lines) {
  const fs::path path = dir / "c.jsonl";
  std::ofstream f(path);
  for (const std::string& l : lines) f << l << "\n";
  return path;
}

TEST(SftPacking, JsonlFormsAndTheirErrors) {
  const fs::path dir = testing::make_temp_dir("sft_jsonl");
  const fs::path path = write_lines(
      dir, {R"({"messages": [{"role": "system", "content": "s1"}, {"role": "user", "content": "u1"},)"
            R"( {"role": "assistant", "content": "a1"}, {"role": "system", "content": "s2"},)"
            R"( {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}]})",
            "",
            R"({"system": "s", "prompt": "p", "response": "r"})",
            R"({"prompt": "p2", "response": "r2"})"});
  const auto lines = read_sft_jsonl(path.string());
  ASSERT_EQ(lines.size(), 3u) << "a blank line is not a sample";
  ASSERT_EQ(lines[0].size(), 2u) << "a system message starts a new conversation";
  EXPECT_EQ(lines[0][1][0].content, "s2");
  EXPECT_EQ(lines[0][1][2].role, "assistant");
  ASSERT_EQ(lines[1][0].size(), 3u);
  EXPECT_EQ(lines[1][0][0].role, "system");
  EXPECT_EQ(lines[1][0][2].content, "r");
  ASSERT_EQ(lines[2][0].size(), 2u);
  EXPECT_EQ(lines[2][0][0].role, "user");

  const auto refused = [&](const std::string& line, const std::vector<std::string>& parts) {
    const fs::path bad = write_lines(dir, {R"({"prompt": "p", "response": "r"})", line});
    std::vector<std::string> all = {bad.string() + ":2"};
    all.insert(all.end(), parts.begin(), parts.end());
    testing::expect_error([&] { read_sft_jsonl(bad.string()); }, all);
  };
  refused("{\"prompt\": \"p\"", {"not JSON"});
  refused("{\"prompt\": 1" + std::string(400, '4') + "}", {"not JSON", "number overflow"});  // beyond a double
  refused(R"({"prompt": "p"})", {"\"prompt\" and \"response\""});
  refused(R"({"messages": {"role": "user"}})", {"must be a list"});
  refused(R"({"messages": [{"role": "user", "content": 3}]})", {"messages[0]", "\"content\" must be a string"});
  refused("[1, 2]", {"JSON object"});
  fs::remove_all(dir);
}

TEST(SftPacking, SplitDividesTheLines) {
  if (!tokenizer_available("HuggingFaceTokenizer")) GTEST_SKIP() << "built without PCRE2";
  const fs::path fixtures = fs::path(MEGATRON_TESTS_SOURCE_DIR) / "data" / "sft";
  const auto tok = make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = fixtures.string()});
  SftDatasetConfig c{.path = (fixtures / "conversations.jsonl").string(), .split = "2,1,0", .seq_length = 127,
                     .format = ChatFormat::ChatML};
  const auto sets = build_sft_datasets(c, *tok);
  ASSERT_TRUE(sets[0] && sets[1]);
  EXPECT_FALSE(sets[2]) << "a zero-width split is absent";
  EXPECT_EQ(sets[0]->conversations(), 22) << "lines [0, 22) of 33";
  EXPECT_EQ(sets[1]->conversations(), 12) << "lines [22, 33): the last holds two conversations";
  EXPECT_EQ(sets[0]->row_width(), 256);
  EXPECT_EQ(sets[0]->truncated(), 0);
}

}  // namespace
}  // namespace megatron::data
