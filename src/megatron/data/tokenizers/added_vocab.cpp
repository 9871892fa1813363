#include "megatron/data/tokenizers/added_vocab.h"

#include <algorithm>

namespace megatron::data {
namespace {
bool is_word_byte(unsigned char c) { return c >= 0x80 || c == '_' || std::isalnum(c); }
bool is_space_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  by_first_byte_.resize(256);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(static_cast<int32_t>(i));
  }
}

std::vector<AddedSplit> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<AddedSplit> out;
  size_t plain_begin = 0;
  const auto emit_plain = [&](size_t end) {
    if (end > plain_begin) out.push_back({{plain_begin, end}, -1});
  };
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (int32_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = tokens_[k];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        const size_t stop = i + t.content.size();
        const bool left_ok = i == 0 || !is_word_byte(static_cast<unsigned char>(text[i - 1]));
        const bool right_ok = stop == text.size() || !is_word_byte(static_cast<unsigned char>(text[stop]));
        if (!left_ok || !right_ok) continue;
      }
      hit = &t;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->content.size();
    if (hit->lstrip) {
      while (begin > plain_begin && is_space_byte(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && is_space_byte(text[end])) ++end;
    }
    emit_plain(begin);
    out.push_back({{begin, end}, hit->id});
    plain_begin = end;
    i = end;
  }
  emit_plain(text.size());
  return out;
}

}  // namespace megatron::data
