#include "megatron/data/tokenizers/gpt2_tokenizer.h"

#include <fstream>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/json_util.h"
#include "megatron/data/utf8.h"

namespace megatron::data {

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file) {
  const Json vocab_json = load_json_file(vocab_file);
  MEGATRON_CHECK(vocab_json.is_object(), vocab_file, ": vocab.json must be an object token -> id");
  StringMap<int32_t> vocab;
  for (const auto& [token, id] : vocab_json.items()) {
    MEGATRON_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX &&
                       !(id.is_number_unsigned() && id.get<uint64_t>() >= INT32_MAX),
                   vocab_file, ": the id of ", quoted_bytes(token), " is not an integer in [0, 2^31 - 1), got ",
                   quoted_bytes(id.dump()));
    vocab.emplace(token, static_cast<int32_t>(id.get<int64_t>()));
  }
  std::ifstream in(merge_file, std::ios::binary);
  MEGATRON_CHECK(in.good(), "cannot open merges file ", merge_file);
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    MEGATRON_CHECK(space != std::string::npos && space > 0 && line.find(' ', space + 1) == std::string::npos,
                   merge_file, ":", line_no, ": a merge must be two tokens separated by one space, got ",
                   quoted_bytes(line));
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  bpe_ = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{}, merge_file + ": merge");
  eod_ = bpe_->token_to_id("<|endoftext|>");
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view raw) const {
  const std::string text = sanitize_utf8(raw);
  std::vector<Span> words;
  regex_.find_all(text, words);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::string mapped;
  for (const Span& w : words) {
    mapped.clear();
    alphabet_.encode(std::string_view(text).substr(w.begin, w.end - w.begin), mapped);
    bpe_->encode_word(mapped, ids);
  }
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    MEGATRON_CHECK(id >= 0 && id < bpe_->size(), "GPT2BPETokenizer::decode: id ", id, " outside [0, ",
                   bpe_->size(), ")");
    alphabet_.decode(bpe_->id_to_token(id), out);
  }
  return out;
}

}  // namespace megatron::data
