#include "megatron/data/gpt_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "megatron/core/error.h"
#include "megatron/core/progress.h"

namespace megatron::data {

int64_t count_tokens(std::span<const int32_t> sequence_lengths, SequenceRange sequences) {
  int64_t total = 0;
  for (int64_t i = sequences.begin; i < sequences.end; ++i) total += sequence_lengths[static_cast<size_t>(i)];
  return total;
}

int64_t num_epochs_for(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t sequence_length,
                       bool add_extra_token) {
  if (!num_samples) return 1;
  const int64_t requested = *num_samples * sequence_length + (add_extra_token ? 1 : 0);
  if (tokens_per_epoch >= requested) return 1;
  MEGATRON_CHECK(tokens_per_epoch > 0, "no tokens per epoch but ", requested, " requested");
  return (requested + tokens_per_epoch - 1) / tokens_per_epoch;
}

std::vector<int32_t> build_document_index(SequenceRange sequences, int64_t num_epochs, NumpyRandomState& random,
                                          bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> index(static_cast<size_t>(num_epochs * sequences.size()));
    size_t at = 0;
    for (int64_t e = 0; e < num_epochs; ++e)
      for (int64_t s = sequences.begin; s < sequences.end; ++s) index[at++] = static_cast<int32_t>(s);
    random.shuffle(std::span<int32_t>(index));
    return index;
  }
  auto first = build_document_index(sequences, num_epochs - 1, random, false);
  auto last = build_document_index(sequences, 1, random, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sequence_lengths,
                                        std::span<const int32_t> document_index, int64_t sequence_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, bool add_extra_token) {
  const int64_t extra = add_extra_token ? 1 : 0;
  int64_t num_samples = 0;
  if (drop_last_partial_sequence) {
    num_samples = (num_epochs * tokens_per_epoch - extra) / sequence_length;
  } else {  // helpers.cpp computes this ceil in single precision
    num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(num_epochs * tokens_per_epoch - extra) / static_cast<float>(sequence_length)));
  }
  std::vector<int64_t> index(static_cast<size_t>(2 * (num_samples + 1)));
  const int64_t last_document = static_cast<int64_t>(document_index.size()) - 1;
  int64_t document = 0;  // position in document_index
  int64_t offset = 0;    // token offset in that document
  index[0] = 0;
  index[1] = 0;
  Progress progress("building the sample index", num_samples, "samples");
  for (int64_t sample = 1; sample <= num_samples; ++sample) {
    if ((sample & 0xFFFF) == 0) progress.update(sample);  // a clock read per 65536 samples
    int64_t remaining = sequence_length + extra;
    while (remaining != 0) {
      const int64_t length = sequence_lengths[static_cast<size_t>(document_index[static_cast<size_t>(document)])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - extra;
        remaining = 0;
      } else {
        if (document == last_document) {  // only reached when the last partial sample is kept
          offset = sequence_lengths[static_cast<size_t>(document_index[static_cast<size_t>(document)])] - extra;
          break;
        }
        ++document;
        offset = 0;
      }
    }
    index[static_cast<size_t>(2 * sample)] = document;
    index[static_cast<size_t>(2 * sample + 1)] = offset;
  }
  progress.update(num_samples);
  return index;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& random) {
  std::vector<int64_t> index(static_cast<size_t>(total_size));
  std::iota(index.begin(), index.end(), int64_t{0});
  random.shuffle(std::span<int64_t>(index.data(), static_cast<size_t>(num_samples)));
  if (num_samples != total_size)
    random.shuffle(std::span<int64_t>(index.data() + num_samples, static_cast<size_t>(total_size - num_samples)));
  return index;
}

GptIndices build_gpt_indices(const GptIndexRequest& request, const std::string& what) {
  const int64_t seq = request.sequence_length;
  const int64_t extra = request.add_extra_token_to_sequence ? 1 : 0;
  MEGATRON_CHECK(seq > 0, what, ": sequence length must be positive, found ", seq);
  MEGATRON_CHECK(request.sequences.begin >= 0 && request.sequences.begin <= request.sequences.end &&
                     request.sequences.end <= static_cast<int64_t>(request.sequence_lengths.size()),
                 what, ": sequence range [", request.sequences.begin, ", ", request.sequences.end,
                 ") outside the dataset's ", request.sequence_lengths.size(), " sequences");
  GptIndices out;
  out.tokens_per_epoch = count_tokens(request.sequence_lengths, request.sequences);
  if (out.tokens_per_epoch <= extra) {
    MEGATRON_CHECK(request.num_samples.has_value() && *request.num_samples == 0, what, ": the split holds ",
                   request.sequences.size(), " sequences (", out.tokens_per_epoch, " tokens, sequences [",
                   request.sequences.begin, ", ", request.sequences.end, ") of ", request.sequence_lengths.size(),
                   ") but ", request.num_samples ? std::to_string(*request.num_samples) : std::string("one epoch of"),
                   " samples of ", seq, " tokens were requested; give this split a larger share (--split) or ",
                   "use a larger corpus");
    out.sample_index = {0, 0};  // an empty dataset: nothing was asked of an empty split
    out.num_epochs = 0;
    return out;
  }
  out.num_epochs = num_epochs_for(out.tokens_per_epoch, request.num_samples, seq, request.add_extra_token_to_sequence);

  int64_t samples_sans_final_epoch = 0;
  if (out.num_epochs > 1) {
    samples_sans_final_epoch = ((out.num_epochs - 1) * out.tokens_per_epoch - extra) / seq;
    const int64_t from_final_epoch = *request.num_samples - samples_sans_final_epoch;
    const int64_t per_epoch = (out.tokens_per_epoch - extra) / seq;
    MEGATRON_CHECK(from_final_epoch >= 0 && from_final_epoch <= per_epoch + 1, what,
                   ": inconsistent epoch arithmetic: ", from_final_epoch, " samples from the final epoch, ", per_epoch,
                   " per epoch");
    out.separate_final_epoch = from_final_epoch < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState random(request.random_seed);
  out.document_index = build_document_index(request.sequences, out.num_epochs, random, out.separate_final_epoch);
  int64_t max_length = 0;
  for (int32_t length : request.sequence_lengths) max_length = std::max<int64_t>(max_length, length);
  out.sample_index_is_int64 = std::max<int64_t>(static_cast<int64_t>(out.document_index.size()), max_length) >
                              std::numeric_limits<int32_t>::max();
  out.sample_index = build_sample_index(request.sequence_lengths, out.document_index, seq, out.num_epochs,
                                        out.tokens_per_epoch, request.drop_last_partial_sequence,
                                        request.add_extra_token_to_sequence);
  const int64_t total = out.num_samples();
  out.shuffle_index_is_int64 = total >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1;
  out.shuffle_index = build_shuffle_index(out.separate_final_epoch ? samples_sans_final_epoch : total, total, random);
  return out;
}

namespace {

// The tokens sample i reads (rows i and i + 1 of the sample index), checked window by window.
int64_t checked_sample_tokens(const GptIndices& x, const GptIndexRequest& r, int64_t i, int64_t extra,
                              const std::string& what) {
  const int64_t begin_pos = x.sample_index[size_t(2 * i)], begin_offset = x.sample_index[size_t(2 * i + 1)];
  const int64_t end_pos = x.sample_index[size_t(2 * i + 2)], end_offset = x.sample_index[size_t(2 * i + 3)];
  const int64_t want = r.sequence_length + extra;
  int64_t filled = 0;
  for (int64_t d = begin_pos; d <= end_pos && filled < want; ++d) {
    const int64_t length = r.sequence_lengths[size_t(x.document_index[size_t(d)])];
    const int64_t offset = d == begin_pos ? begin_offset : 0;
    const int64_t stop = d == end_pos ? end_offset + extra : length;
    // Checked before the count: a window starting past its sequence's end would otherwise read 0 tokens and
    // pass unnoticed (a valid row may start exactly at the end, after a sample that used the whole sequence).
    MEGATRON_CHECK(offset <= length && stop <= length, what, ": sample_index row ", i, " or ", i + 1, " (sample ", i,
                   ") reads tokens [", offset, ", ", stop, ") of sequence ", x.document_index[size_t(d)],
                   ", which has ", length);
    const int64_t count = std::min(stop - offset, want - filled);
    if (count <= 0) continue;
    filled += count;
  }
  return filled;
}

void check_document_index(const GptIndices& x, const GptIndexRequest& r, const std::string& what) {
  for (size_t k = 0; k < x.document_index.size(); ++k)
    MEGATRON_CHECK(x.document_index[k] >= r.sequences.begin && x.document_index[k] < r.sequences.end, what,
                   ": document_index[", k, "] = ", x.document_index[k], " is not a sequence of the split [",
                   r.sequences.begin, ", ", r.sequences.end, ")");
}

void check_sample_rows(const GptIndices& x, const std::string& what) {
  const int64_t rows = static_cast<int64_t>(x.sample_index.size() / 2);
  MEGATRON_CHECK(x.sample_index.size() % 2 == 0 && rows >= 1 && x.sample_index[0] == 0 && x.sample_index[1] == 0,
                 what, ": sample_index must start with the row (0, 0)");
  const int64_t documents = static_cast<int64_t>(x.document_index.size());
  for (int64_t i = 1; i < rows; ++i) {
    const int64_t pos = x.sample_index[size_t(2 * i)], offset = x.sample_index[size_t(2 * i + 1)];
    const int64_t last_pos = x.sample_index[size_t(2 * i - 2)], last_offset = x.sample_index[size_t(2 * i - 1)];
    MEGATRON_CHECK(pos >= 0 && pos < documents && offset >= 0, what, ": sample_index row ", i, " (", pos, ", ",
                   offset, ") is outside the ", documents, " documents of the document index");
    MEGATRON_CHECK(pos > last_pos || (pos == last_pos && offset >= last_offset), what, ": sample_index row ", i,
                   " (", pos, ", ", offset, ") goes back from row ", i - 1, " (", last_pos, ", ", last_offset, ")");
  }
}

}  // namespace

void check_gpt_indices(const GptIndices& x, const GptIndexRequest& r, const std::string& what) {
  const int64_t extra = r.add_extra_token_to_sequence ? 1 : 0;
  MEGATRON_CHECK(r.sequences.begin >= 0 && r.sequences.begin <= r.sequences.end &&
                     r.sequences.end <= static_cast<int64_t>(r.sequence_lengths.size()),
                 what, ": sequence range [", r.sequences.begin, ", ", r.sequences.end, ") outside the dataset's ",
                 r.sequence_lengths.size(), " sequences");
  check_document_index(x, r, what);
  check_sample_rows(x, what);
  const int64_t samples = x.num_samples();
  MEGATRON_CHECK(!r.num_samples || samples >= *r.num_samples, what, ": the index holds ", samples,
                 " samples, fewer than the ", *r.num_samples, " requested");
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t tokens = checked_sample_tokens(x, r, i, extra, what);
    const bool may_be_partial = i == samples - 1 && !r.drop_last_partial_sequence;
    MEGATRON_CHECK(tokens == r.sequence_length + extra || (may_be_partial && tokens > 0), what, ": sample ", i,
                   " holds ", tokens, " tokens, expected ", r.sequence_length + extra);
  }
  MEGATRON_CHECK(static_cast<int64_t>(x.shuffle_index.size()) == samples, what, ": the shuffle index has ",
                 x.shuffle_index.size(), " entries for ", samples, " samples");
  std::vector<bool> seen(size_t(samples), false);
  for (size_t k = 0; k < x.shuffle_index.size(); ++k) {
    const int64_t s = x.shuffle_index[k];
    MEGATRON_CHECK(s >= 0 && s < samples && !seen[size_t(s)], what, ": shuffle_index[", k, "] = ", s,
                   s >= 0 && s < samples ? " appears twice" : str_cat(" is outside [0, ", samples, ")"));
    seen[size_t(s)] = true;
  }
}

}  // namespace megatron::data
