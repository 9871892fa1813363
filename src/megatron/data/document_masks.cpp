#include "megatron/data/document_masks.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::data {

SampleMasks ltor_masks_and_position_ids(std::span<const int64_t> sample, int64_t eod, const DocumentFlags& flags) {
  MEGATRON_CHECK(sample.size() >= 2, "ltor_masks_and_position_ids: a sample needs at least 2 tokens (s + 1), got ",
                 sample.size());
  const int64_t s = int64_t(sample.size()) - 1;
  SampleMasks m;
  m.tokens.assign(sample.begin(), sample.end() - 1);
  m.labels.assign(sample.begin() + 1, sample.end());
  m.loss_mask.assign(size_t(s), 1.0f);
  m.position_ids.resize(size_t(s));
  m.document_offsets = {0};
  int64_t document_start = 0;  // the first token of the current document
  for (int64_t i = 0; i < s; ++i) {
    const bool is_eod = m.tokens[size_t(i)] == eod;
    m.position_ids[size_t(i)] = flags.reset_position_ids ? i - document_start : i;
    if (is_eod && flags.eod_mask_loss) m.loss_mask[size_t(i)] = 0.0f;
    if (m.labels[size_t(i)] == kPadTokenId) m.loss_mask[size_t(i)] = 0.0f;
    if (is_eod && i + 1 < s) {  // the next token opens a new document
      document_start = i + 1;
      if (flags.reset_attention_mask) m.document_offsets.push_back(i + 1);
    }
  }
  m.document_offsets.push_back(s);
  for (int64_t& t : m.tokens) t = t == kPadTokenId ? 0 : t;
  for (int64_t& t : m.labels) t = t == kPadTokenId ? 0 : t;
  return m;
}

bool attends(std::span<const int64_t> offsets, int64_t query, int64_t key) {
  if (key > query) return false;
  // The document of a token: the last offset <= it.
  auto document = [&](int64_t t) { return std::upper_bound(offsets.begin(), offsets.end(), t) - offsets.begin(); };
  return document(query) == document(key);
}

}  // namespace megatron::data
