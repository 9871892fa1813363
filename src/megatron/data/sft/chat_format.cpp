#include "megatron/data/sft/chat_format.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

constexpr std::string_view kFormatNames = "llama3, chatml, nemotron-h-aligned, identity or default";

std::string strip(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

void check_role(const ChatMessage& m) {
  MEGATRON_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
                 "SFT conversation: role \"", m.role, "\" is not one of system, user, assistant, tool");
}

void render_llama3(const std::vector<ChatMessage>& messages, std::vector<ChatPiece>& out) {
  out.push_back({"<|begin_of_text|>", false, true});
  for (const ChatMessage& m : messages) {
    const bool answer = m.role == "assistant";
    out.push_back({"<|start_header_id|>", false, true});
    out.push_back({m.role, false, false});
    out.push_back({"<|end_header_id|>", false, true});
    out.push_back({"\n\n", false, false});
    out.push_back({strip(m.content), answer, false});
    out.push_back({"<|eot_id|>", answer, true});
  }
}

void render_chatml(const std::vector<ChatMessage>& messages, std::vector<ChatPiece>& out) {
  for (const ChatMessage& m : messages) {
    const bool answer = m.role == "assistant";
    out.push_back({"<|im_start|>", false, true});
    out.push_back({m.role + "\n", false, false});
    out.push_back({m.content, answer, false});
    out.push_back({"<|im_end|>", answer, true});
    out.push_back({"\n", false, false});
  }
}

// Megatron's nemotron_h_aligned_custom_template: the user turn carries the assistant's header.
void render_nemotron(const std::vector<ChatMessage>& messages, std::vector<ChatPiece>& out) {
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      out.push_back({"<SPECIAL_10>", false, true});
      out.push_back({"System\n" + strip(m.content) + "\n", false, false});
    } else if (m.role == "user") {
      out.push_back({"<SPECIAL_11>", false, true});
      out.push_back({"User\n" + strip(m.content) + "\n", false, false});
      out.push_back({"<SPECIAL_11>", false, true});
      out.push_back({"Assistant\n", false, false});
    } else if (m.role == "assistant") {
      out.push_back({strip(m.content) + "\n", true, false});
    }
  }
}

}  // namespace

const char* chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::NemotronHAligned: return "nemotron-h-aligned";
    case ChatFormat::Identity: return "identity";
  }
  return "?";
}

ChatFormat recognise_chat_template(std::string_view t, std::string_view where) {
  const auto has = [&](std::string_view marker) { return t.find(marker) != std::string_view::npos; };
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) return ChatFormat::Llama3;
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::ChatML;
  MEGATRON_FAIL(where, ": the chat template is neither Llama 3's (<|start_header_id|> ... <|eot_id|>) nor ChatML "
                "(<|im_start|> ... <|im_end|>); Jinja templates are not interpreted here: name the format with "
                "--sft-tokenizer-prompt-format (", kFormatNames, ")");
}

ChatFormat resolve_chat_format(std::string_view name, const std::string& tokenizer_model) {
  if (name == "llama3") return ChatFormat::Llama3;
  if (name == "chatml") return ChatFormat::ChatML;
  if (name == "nemotron-h-aligned") return ChatFormat::NemotronHAligned;
  if (name == "identity") return ChatFormat::Identity;
  MEGATRON_CHECK(name == "default", "--sft-tokenizer-prompt-format ", name, ": unknown, use ", kFormatNames);
  namespace fs = std::filesystem;
  fs::path dir = tokenizer_model;
  if (!fs::is_directory(dir)) dir = dir.parent_path();
  const fs::path config = dir / "tokenizer_config.json";
  MEGATRON_CHECK(fs::exists(config), "--sft-tokenizer-prompt-format default reads the tokenizer's chat template from ",
                 config.string(), ", which does not exist; name the format instead (", kFormatNames, ")");
  std::ifstream f(config);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  MEGATRON_CHECK(!j.is_discarded() && j.is_object(), config.string(), ": not a JSON object");
  const auto it = j.find("chat_template");
  MEGATRON_CHECK(it != j.end() && it->is_string(), config.string(),
                 ": no chat_template string (a list of named templates is not supported); name the format with "
                 "--sft-tokenizer-prompt-format (", kFormatNames, ")");
  return recognise_chat_template(it->get<std::string>(), config.string());
}

std::vector<ChatPiece> render_conversation(ChatFormat format, const std::vector<ChatMessage>& messages) {
  for (const ChatMessage& m : messages) check_role(m);
  std::vector<ChatPiece> out;
  switch (format) {
    case ChatFormat::Llama3: render_llama3(messages, out); break;
    case ChatFormat::ChatML: render_chatml(messages, out); break;
    case ChatFormat::NemotronHAligned: render_nemotron(messages, out); break;
    case ChatFormat::Identity:
      for (const ChatMessage& m : messages) out.push_back({m.content, m.role == "assistant", false});
      break;
  }
  return out;
}

ConversationTokens tokenize_conversation(ChatFormat format, const std::vector<ChatMessage>& messages,
                                         const Tokenizer& tokenizer) {
  ConversationTokens out;
  for (const ChatPiece& piece : render_conversation(format, messages)) {
    if (piece.text.empty()) continue;
    const std::vector<int32_t> ids = tokenizer.encode(piece.text);
    MEGATRON_CHECK(!piece.special || ids.size() == 1, "SFT format ", chat_format_name(format), ": the marker ",
                   piece.text, " is ", ids.size(), " tokens for this tokenizer, not one special token (does the "
                   "tokenizer belong to this chat format?)");
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.trained.insert(out.trained.end(), ids.size(), uint8_t(piece.trained));
  }
  return out;
}

}  // namespace megatron::data
