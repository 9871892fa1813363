// A BPE model as HF tokenizers' models.BPE defines it (and GPT-2's encoder.py, which it reproduces):
// a vocabulary token -> id, merges ranked by their order, and per pre-token ("word"):
//   1. with ignore_merges, a word that is itself a vocabulary token is that token;
//   2. each character becomes its token (continuing_subword_prefix before all but the first character,
//      end_of_word_suffix after the last); a character missing from the vocabulary becomes its bytes'
//      <0xXX> tokens with byte_fallback, else the unk token (runs fused with fuse_unk), else is dropped;
//   3. pairs merge by rank (bpe_merge.h).
// Results are cached per word (thread-safe; the cache stops growing at a fixed number of entries).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/data/tokenizers/string_map.h"

namespace megatron::data {

struct BpeOptions {
  std::string unk_token;  // empty: none
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // `vocab`: token -> id (ids need not be dense); `merges`: (left, right) in rank order. `where` names the
  // source of the merges (file, JSON path) in errors, followed by "[rank]": a merge whose parts or result are
  // not in the vocabulary.
  BpeModel(StringMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, std::string_view where);

  // Appends the ids of one word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // -1 when absent.
  int32_t token_to_id(std::string_view token) const;
  // The token of `id` (empty when the id is unused).
  const std::string& id_to_token(int32_t id) const;
  // One more than the largest id.
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> tokens_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left<<32|right) -> (rank, new id)
  BpeOptions options_;
  int32_t unk_id_ = -1;
  std::vector<int32_t> byte_ids_;  // <0xXX> ids, -1 when absent

  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace megatron::data
