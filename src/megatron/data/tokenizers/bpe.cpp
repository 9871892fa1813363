#include "megatron/data/tokenizers/bpe.h"

#include <cstdio>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/data/tokenizers/bpe_merge.h"
#include "megatron/data/utf8.h"

namespace megatron::data {
namespace {
constexpr size_t kCacheCapacity = 1 << 17;
uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

BpeModel::BpeModel(StringMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, std::string_view where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    MEGATRON_CHECK(id >= 0, where, ": token ", quoted_bytes(token), " has negative id ", id);
    max_id = std::max(max_id, id);
  }
  // id -> token is a table as long as the largest id: ids far beyond the token count mean a corrupt file.
  const int64_t id_limit = std::max<int64_t>(2 * static_cast<int64_t>(vocab_.size()), int64_t{1} << 20);
  MEGATRON_CHECK(max_id < id_limit, where, ": the largest token id ", max_id, " is far beyond the ", vocab_.size(),
                 " tokens (ids must stay below ", id_limit, ")");
  tokens_.resize(static_cast<size_t>(max_id) + 1);
  for (const auto& [token, id] : vocab_) tokens_[id] = token;
  if (!options_.unk_token.empty()) {
    unk_id_ = token_to_id(options_.unk_token);
    MEGATRON_CHECK(unk_id_ >= 0, where, ": unk_token ", quoted_bytes(options_.unk_token), " is not in the vocabulary");
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = token_to_id(a), ib = token_to_id(b);
    MEGATRON_CHECK(ia >= 0, where, "[", rank, "]: merge (", quoted_bytes(a), " ", quoted_bytes(b), "): ", quoted_bytes(a),
                   " is not in the vocabulary");
    MEGATRON_CHECK(ib >= 0, where, "[", rank, "]: merge (", quoted_bytes(a), " ", quoted_bytes(b), "): ", quoted_bytes(b),
                   " is not in the vocabulary");
    std::string merged = a;
    if (prefix_len > 0 && b.compare(0, prefix_len, options_.continuing_subword_prefix) == 0) {
      merged.append(b, prefix_len);
    } else {
      merged += b;
    }
    const int32_t id = token_to_id(merged);
    MEGATRON_CHECK(id >= 0, where, "[", rank, "]: merge (", quoted_bytes(a), " ", quoted_bytes(b), "): the result ",
                   quoted_bytes(merged), " is not in the vocabulary");
    merges_.try_emplace(pair_key(ia, ib), static_cast<int32_t>(rank), id);  // first (lowest) rank wins
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < size() ? tokens_[id] : kEmpty;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const int32_t id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() < kCacheCapacity) cache_.try_emplace(std::string(word), out.begin() + first, out.end());
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<BpeSymbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, uint32_t begin, uint32_t end) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, begin, end, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
  };
  int32_t pending_unk_begin = -1, pending_unk_end = -1;
  const auto flush_unk = [&] {
    if (pending_unk_begin >= 0) add(unk_id_, pending_unk_begin, pending_unk_end);
    pending_unk_begin = -1;
  };
  std::string scratch;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    i += utf8_length(static_cast<unsigned char>(word[i]));
    std::string_view ch = word.substr(begin, i - begin);
    const bool decorate = (begin > 0 && !options_.continuing_subword_prefix.empty()) ||
                          (i == word.size() && !options_.end_of_word_suffix.empty());
    if (decorate) {
      scratch.clear();
      if (begin > 0) scratch += options_.continuing_subword_prefix;
      scratch += ch;
      if (i == word.size()) scratch += options_.end_of_word_suffix;
      ch = scratch;
    }
    if (const int32_t id = token_to_id(ch); id >= 0) {
      flush_unk();
      add(id, static_cast<uint32_t>(begin), static_cast<uint32_t>(i));
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char c : ch) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (size_t k = 0; k < ch.size(); ++k) add(byte_ids_[static_cast<unsigned char>(ch[k])], begin, i);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk_begin >= 0 && options_.fuse_unk) {
        pending_unk_end = static_cast<int32_t>(i);
      } else {
        flush_unk();
        pending_unk_begin = static_cast<int32_t>(begin);
        pending_unk_end = static_cast<int32_t>(i);
      }
    }
  }
  flush_unk();
  bpe_merge(symbols, [&](const BpeSymbol& a, const BpeSymbol& b) -> BpeCandidate {
    const auto it = merges_.find(pair_key(a.id, b.id));
    return it == merges_.end() ? BpeCandidate{-1, -1} : BpeCandidate{it->second.first, it->second.second};
  });
  for (const BpeSymbol& s : symbols) {
    if (s.id >= 0) out.push_back(s.id);
  }
}

}  // namespace megatron::data
