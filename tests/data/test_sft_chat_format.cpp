// The Jinja-free chat formats of --sft: their renderings equal what jinja2 renders from Llama 3 Instruct's and
// ChatML's chat templates (tests/data/sft/chat_template_reference.json, made by make_fixtures.py); the loss
// mask covers exactly the assistant contents and their end-of-turn markers; templates are recognised by their
// markers and anything else is refused with the formats to name; with the shipped byte-level BPE tokenizer,
// the piecewise encoding equals the encoding of the whole rendered text for every conversation of the
// shipped set.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "megatron/data/sft/chat_format.h"
#include "megatron/data/sft/sft_dataset.h"

namespace megatron::data {
namespace {

namespace fs = std::filesystem;

fs::path fixtures() { return fs::path(MEGATRON_TESTS_SOURCE_DIR) / "data" / "sft"; }

nlohmann::json reference() {
  std::ifstream f(fixtures() / "chat_template_reference.json");
  return nlohmann::json::parse(f);
}

std::vector<ChatMessage> messages_of(const nlohmann::json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

std::string rendered_text(ChatFormat format, const std::vector<ChatMessage>& messages) {
  std::string text;
  for (const ChatPiece& p : render_conversation(format, messages)) text += p.text;
  return text;
}

// A tokenizer that is its own reference: one id per byte (0-255), and ids 1000 + k for the markers it knows,
// so the trained tokens decode back to the exact text they stand for.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    for (size_t k = 0; k < kMarkers.size(); ++k)
      if (text == kMarkers[k]) return {int32_t(1000 + k)};
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += id >= 1000 ? kMarkers[size_t(id - 1000)] : std::string(1, char(id));
    return out;
  }
  int64_t vocab_size() const override { return 1000 + int64_t(kMarkers.size()); }

 private:
  const std::vector<std::string> kMarkers = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                             "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<SPECIAL_10>",
                                             "<SPECIAL_11>"};
};

TEST(SftChatFormat, RenderingsEqualJinjaRenderingsOfTheTemplates) {
  const nlohmann::json ref = reference();
  for (const auto& c : ref["cases"]) {
    const std::vector<ChatMessage> m = messages_of(c["messages"]);
    EXPECT_EQ(rendered_text(ChatFormat::Llama3, m), c["llama3"].get<std::string>());
    EXPECT_EQ(rendered_text(ChatFormat::ChatML, m), c["chatml"].get<std::string>());
  }
  // Megatron's nemotron-h-aligned template, written out: the user turn ends with the assistant's header.
  const std::vector<ChatMessage> m = {{"system", " Sys "}, {"user", "Q?\n"}, {"assistant", " A. "}};
  EXPECT_EQ(rendered_text(ChatFormat::NemotronHAligned, m),
            "<SPECIAL_10>System\nSys\n<SPECIAL_11>User\nQ?\n<SPECIAL_11>Assistant\nA.\n");
  EXPECT_EQ(rendered_text(ChatFormat::Identity, m), " Sys Q?\n A. ");
}

TEST(SftChatFormat, LossMaskCoversTheAnswersAndTheirEndMarkers) {
  const ByteTokenizer tok;
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "hello"}, {"assistant", " one "},
                                      {"user", "again"}, {"assistant", "two"}};
  const std::map<ChatFormat, std::string> answers = {{ChatFormat::Llama3, "one<|eot_id|>two<|eot_id|>"},
                                                     {ChatFormat::ChatML, " one <|im_end|>two<|im_end|>"},
                                                     {ChatFormat::NemotronHAligned, "one\ntwo\n"},
                                                     {ChatFormat::Identity, " one two"}};
  for (const auto& [format, want] : answers) {
    const ConversationTokens t = tokenize_conversation(format, m, tok);
    ASSERT_EQ(t.tokens.size(), t.trained.size());
    std::vector<int32_t> trained, all;
    for (size_t i = 0; i < t.tokens.size(); ++i)
      if (t.trained[i]) trained.push_back(t.tokens[i]);
    EXPECT_EQ(tok.decode(trained), want) << chat_format_name(format);
    EXPECT_EQ(tok.decode(t.tokens), rendered_text(format, m)) << chat_format_name(format);
  }
}

TEST(SftChatFormat, TemplatesAreRecognisedByTheirMarkersOrRefused) {
  const nlohmann::json ref = reference();
  EXPECT_EQ(recognise_chat_template(ref["llama3_template"].get<std::string>(), "t"), ChatFormat::Llama3);
  EXPECT_EQ(recognise_chat_template(ref["chatml_template"].get<std::string>(), "t"), ChatFormat::ChatML);
  EXPECT_EQ(resolve_chat_format("default", (fixtures() / "tokenizer.json").string()), ChatFormat::ChatML);
  EXPECT_EQ(resolve_chat_format("llama3", "unused"), ChatFormat::Llama3);
  testing::expect_error([] { recognise_chat_template("{{ '[INST] ' + m }}", "mistral/tokenizer_config.json"); },
                        {"mistral/tokenizer_config.json", "--sft-tokenizer-prompt-format", "llama3, chatml"});
  testing::expect_error([] { resolve_chat_format("vicuna", ""); }, {"vicuna", "unknown"});
  const fs::path dir = testing::make_temp_dir("sft_no_config");
  testing::expect_error([&] { resolve_chat_format("default", dir.string()); }, {"tokenizer_config.json", "name the format"});
  fs::remove_all(dir);
  testing::expect_error([] { render_conversation(ChatFormat::ChatML, {{"narrator", "x"}}); }, {"narrator"});
  // A marker the tokenizer splits into several tokens is refused (a tokenizer of another family).
  class Plain final : public Tokenizer {
   public:
    std::vector<int32_t> encode(std::string_view t) const override { return std::vector<int32_t>(t.begin(), t.end()); }
    std::string decode(const std::vector<int32_t>&) const override { return {}; }
    int64_t vocab_size() const override { return 256; }
  };
  testing::expect_error([] { tokenize_conversation(ChatFormat::ChatML, {{"user", "x"}}, Plain()); },
                        {"<|im_start|>", "not one special token"});
}

TEST(SftChatFormat, PiecewiseTokensEqualTheWholeRenderingsTokens) {
  if (!tokenizer_available("HuggingFaceTokenizer")) GTEST_SKIP() << "built without PCRE2";
  const auto tok = make_tokenizer({.type = "SFTTokenizer", .tokenizer_model = fixtures().string()});
  int64_t conversations = 0;
  for (const auto& line : read_sft_jsonl((fixtures() / "conversations.jsonl").string()))
    for (const auto& c : line) {
      const ConversationTokens t = tokenize_conversation(ChatFormat::ChatML, c, *tok);
      const std::vector<int32_t> whole = tok->encode(rendered_text(ChatFormat::ChatML, c));
      EXPECT_EQ(t.tokens, whole) << rendered_text(ChatFormat::ChatML, c);
      ++conversations;
    }
  EXPECT_EQ(conversations, 34) << "33 lines, the last with two conversations";
}

}  // namespace
}  // namespace megatron::data
