#include "megatron/trainer/micro_batch.h"

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

}  // namespace megatron::trainer
