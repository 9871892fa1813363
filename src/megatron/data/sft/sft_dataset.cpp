#include "megatron/data/sft/sft_dataset.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "megatron/core/error.h"

namespace megatron::data {
namespace {

using Json = nlohmann::json;

std::string string_member(const Json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  MEGATRON_CHECK(it != j.end() && it->is_string(), where, ": \"", key, "\" must be a string");
  return it->get<std::string>();
}

// Megatron's _split_conversations: each "system" message begins a new conversation.
std::vector<std::vector<ChatMessage>> conversations_of(const Json& line, const std::string& where) {
  MEGATRON_CHECK(line.is_object(), where, ": a line must be a JSON object with \"messages\" or \"prompt\"/\"response\"");
  std::vector<std::vector<ChatMessage>> out;
  if (const auto it = line.find("messages"); it != line.end()) {
    MEGATRON_CHECK(it->is_array(), where, ": \"messages\" must be a list of {role, content}");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string at = where + ": messages[" + std::to_string(i) + "]";
      MEGATRON_CHECK((*it)[i].is_object(), at, " must be an object {role, content}");
      ChatMessage m{string_member((*it)[i], "role", at), string_member((*it)[i], "content", at)};
      if (out.empty() || m.role == "system") out.emplace_back();
      out.back().push_back(std::move(m));
    }
    return out;
  }
  MEGATRON_CHECK(line.contains("prompt") && line.contains("response"), where,
                 ": a line needs \"messages\" or both \"prompt\" and \"response\"");
  std::vector<ChatMessage> c;
  if (line.contains("system")) c.push_back({"system", string_member(line, "system", where)});
  c.push_back({"user", string_member(line, "prompt", where)});
  c.push_back({"assistant", string_member(line, "response", where)});
  out.push_back(std::move(c));
  return out;
}

}  // namespace

std::vector<std::vector<std::vector<ChatMessage>>> read_sft_jsonl(const std::string& path) {
  std::ifstream f(path);
  MEGATRON_CHECK(f.good(), "--sft: cannot open ", path);
  std::vector<std::vector<std::vector<ChatMessage>>> lines;
  int64_t number = 0;
  for (std::string text; std::getline(f, text);) {
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are not samples
    const std::string where = path + ":" + std::to_string(number);
    Json j;
    try {
      j = Json::parse(text);
    } catch (const Json::exception& e) {  // malformed, or a number beyond what a double holds
      MEGATRON_FAIL(where, ": not JSON (", e.what(), ")");
    }
    lines.push_back(conversations_of(j, where));
  }
  MEGATRON_CHECK(!lines.empty(), "--sft: ", path, " holds no conversations");
  return lines;
}

void SftDataset::sample(int64_t index, std::span<int64_t> out) const {
  MEGATRON_CHECK(int64_t(out.size()) == rows_.row_width, "SftDataset::sample: ", out.size(), " values for rows of ",
                 rows_.row_width);
  const int64_t row = index % size();
  std::copy_n(rows_.values.begin() + row * rows_.row_width, rows_.row_width, out.begin());
}

std::array<std::optional<SftDataset>, kNumSplits> build_sft_datasets(const SftDatasetConfig& config,
                                                                      const Tokenizer& tokenizer) {
  const auto lines = read_sft_jsonl(config.path);
  const SplitBookends bookends = split_bookends(config.split);
  const int64_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : std::max<int64_t>(tokenizer.eod(), 0);
  std::array<std::optional<SftDataset>, kNumSplits> out;
  for (int s = 0; s < kNumSplits; ++s) {
    if (!bookends[size_t(s)]) continue;
    const SequenceRange range = split_range(*bookends[size_t(s)], int64_t(lines.size()));
    if (range.size() == 0) continue;
    std::vector<ConversationTokens> tokens;
    for (int64_t l = range.begin; l < range.end; ++l)
      for (const auto& conversation : lines[size_t(l)])
        tokens.push_back(tokenize_conversation(config.format, conversation, tokenizer));
    const int64_t count = int64_t(tokens.size());
    out[size_t(s)].emplace(pack_conversations(tokens, config.seq_length, pad), count);
  }
  return out;
}

}  // namespace megatron::data
