// The BPE merge loop shared by the HF/GPT-2 model (ranks of id pairs) and tiktoken (ranks of byte strings).
//
// Semantics (identical to HF tokenizers' Word::merge_all and to tiktoken's byte_pair_merge): while some
// adjacent pair of symbols can merge, merge the pair with the lowest rank, the leftmost one on ties.
// Implementation: a min-heap of candidate pairs keyed by (rank, left index) with lazy invalidation, so a
// word of n symbols costs O(n log n). Symbol indices never move; merged-away symbols are marked dead.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

namespace megatron::data {

struct BpeSymbol {
  int32_t id;      // token id (HF) or rank (tiktoken); -1 once merged away
  uint32_t begin;  // byte span of the symbol in the word
  uint32_t end;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
};

struct BpeCandidate {
  int32_t rank;    // merge priority, lower first; < 0: the pair does not merge
  int32_t new_id;  // id of the merged symbol
};

// Merges `symbols` (linked in order, prev/next set) in place. pair_rank(left, right) -> BpeCandidate.
template <class PairRank>
void bpe_merge(std::vector<BpeSymbol>& symbols, PairRank&& pair_rank) {
  struct Entry {
    int32_t rank, pos, new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Entry> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>{}, std::move(storage));
  const auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const BpeCandidate c = pair_rank(symbols[left], symbols[right]);
    if (c.rank >= 0) heap.push({c.rank, left, c.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push(i);
  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    BpeSymbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    BpeSymbol& right = symbols[left.next];
    const BpeCandidate now = pair_rank(left, right);
    if (now.rank != top.rank || now.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    push(left.prev);
    push(top.pos);
  }
}

}  // namespace megatron::data
