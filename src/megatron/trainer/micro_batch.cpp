#include "megatron/trainer/micro_batch.h"

#include <algorithm>
#include <span>
#include <vector>

#include "megatron/core/error.h"

namespace megatron::trainer {

HostMicroBatch make_host_micro_batch(const Tensor& samples, int64_t eod, const data::DocumentFlags& flags,
                                     const parallel::SequenceSplit& split, Allocator& host) {
  MEGATRON_CHECK(samples.rank() == 2 && samples.dtype() == DType::I64 && samples.dim(1) == split.seq + 1,
                 "make_host_micro_batch: samples ", samples.describe(), " must be i64[b, ", split.seq + 1, "]");
  const int64_t b = samples.dim(0), width = samples.dim(1), S = split.seq, s = split.local_seq();
  HostMicroBatch mb{.tokens = Tensor::empty(Shape{b, s}, DType::I64, host),
                    .labels = Tensor::empty(Shape{b, s}, DType::I64, host),
                    .loss_mask = Tensor::empty(Shape{b, s}, DType::F32, host)};
  if (flags.reset_position_ids) mb.position_ids = Tensor::empty(Shape{b, s}, DType::I64, host);
  std::vector<int64_t> offsets = {0};
  for (int64_t i = 0; i < b; ++i) {
    const data::SampleMasks m = data::ltor_masks_and_position_ids(
        std::span<const int64_t>(samples.data<int64_t>() + i * width, size_t(width)), eod, flags);
    for (int64_t j = 0; j < s; ++j) {
      const size_t global = size_t(split.global_position(j));
      mb.tokens.data<int64_t>()[i * s + j] = m.tokens[global];
      mb.labels.data<int64_t>()[i * s + j] = m.labels[global];
      mb.loss_mask.data<float>()[i * s + j] = m.loss_mask[global];
      mb.loss_tokens += double(m.loss_mask[global]);
      if (flags.reset_position_ids) mb.position_ids.data<int64_t>()[i * s + j] = m.position_ids[global];
    }
    for (float counted : m.loss_mask) mb.row_loss_tokens += double(counted);
    for (size_t d = 1; d < m.document_offsets.size(); ++d) offsets.push_back(i * S + m.document_offsets[d]);
  }
  if (flags.reset_attention_mask) {
    mb.cu_seqlens = Tensor::empty(Shape{int64_t(offsets.size())}, DType::I64, host);
    std::copy(offsets.begin(), offsets.end(), mb.cu_seqlens.data<int64_t>());
  }
  return mb;
}

namespace {

// The conversation of a tag (data/sft/sft_packing.h), -1 for the padding.
int64_t conversation_of(int64_t tag) { return tag < 0 ? -1 : tag / 2; }

}  // namespace

HostMicroBatch make_packed_host_micro_batch(const Tensor& rows, const parallel::SequenceSplit& split, Allocator& host) {
  const int64_t S = split.seq, s = split.local_seq(), width = 2 * (S + 1);
  MEGATRON_CHECK(rows.rank() == 2 && rows.dtype() == DType::I64 && rows.dim(1) == width,
                 "make_packed_host_micro_batch: rows ", rows.describe(), " must be i64[b, ", width, "]");
  const int64_t b = rows.dim(0);
  HostMicroBatch mb{.tokens = Tensor::empty(Shape{b, s}, DType::I64, host),
                    .labels = Tensor::empty(Shape{b, s}, DType::I64, host),
                    .loss_mask = Tensor::empty(Shape{b, s}, DType::F32, host),
                    .position_ids = Tensor::empty(Shape{b, s}, DType::I64, host)};
  std::vector<int64_t> offsets = {0};
  std::vector<int64_t> position(static_cast<size_t>(S));
  std::vector<float> counted(static_cast<size_t>(S));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t* tokens = rows.data<int64_t>() + i * width;
    const int64_t* tags = tokens + S + 1;
    for (int64_t j = 0; j < S; ++j) {
      const bool starts = j > 0 && conversation_of(tags[j]) != conversation_of(tags[j - 1]);
      if (starts) offsets.push_back(i * S + j);
      position[size_t(j)] = (j == 0 || starts) ? 0 : position[size_t(j - 1)] + 1;
      const bool trained = tags[j + 1] >= 0 && tags[j + 1] % 2 == 1;
      counted[size_t(j)] = trained && conversation_of(tags[j + 1]) == conversation_of(tags[j]) ? 1.0f : 0.0f;
      mb.row_loss_tokens += double(counted[size_t(j)]);
    }
    offsets.push_back((i + 1) * S);
    for (int64_t j = 0; j < s; ++j) {
      const int64_t global = split.global_position(j);
      mb.tokens.data<int64_t>()[i * s + j] = tokens[global];
      mb.labels.data<int64_t>()[i * s + j] = tokens[global + 1];
      mb.loss_mask.data<float>()[i * s + j] = counted[size_t(global)];
      mb.position_ids.data<int64_t>()[i * s + j] = position[size_t(global)];
      mb.loss_tokens += double(counted[size_t(global)]);
    }
  }
  mb.cu_seqlens = Tensor::empty(Shape{int64_t(offsets.size())}, DType::I64, host);
  std::copy(offsets.begin(), offsets.end(), mb.cu_seqlens.data<int64_t>());
  return mb;
}

double document_squares(const Tensor& cu_seqlens) {
  const int64_t* offsets = cu_seqlens.data<int64_t>();
  double squares = 0;
  for (int64_t i = 0; i + 1 < cu_seqlens.numel(); ++i)
    squares += double(offsets[i + 1] - offsets[i]) * double(offsets[i + 1] - offsets[i]);
  return squares;
}

int64_t longest_document(const Tensor& cu_seqlens) {
  const int64_t* offsets = cu_seqlens.data<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i + 1 < cu_seqlens.numel(); ++i) longest = std::max(longest, offsets[i + 1] - offsets[i]);
  return longest;
}

}  // namespace megatron::trainer
