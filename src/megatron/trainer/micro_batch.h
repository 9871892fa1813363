// One data-parallel rank's micro-batch on the host, made from its samples ([b, S + 1] tokens, S = --seq-length)
// the way Megatron's GPTDataset and get_batch_on_this_cp_rank make it (data/document_masks.h):
//   tokens, labels [b, s] I64: the inputs and the next tokens (padding mapped to 0);
//   loss_mask [b, s] F32: 0 on the EOD tokens under --eod-mask-loss and where the label is padding, else 1;
//   position_ids [b, s] I64 under --reset-position-ids (positions restart after every EOD), else undefined
//     (the model's own positions 0..S-1);
//   cu_seqlens, host I64 [N + 1] under --reset-attention-mask: the documents of the whole micro-batch as
//     cumulative offsets into its b * S tokens in their original order (each row's boundaries shifted by
//     row * S; a row boundary always ends a document), else undefined;
//   loss_tokens: sum(loss_mask), the tokens that count in the loss (Megatron's num_tokens); row_loss_tokens:
//     the same over the whole rows (all CP ranks' tokens; equal to loss_tokens without CP).
// Under context parallelism (`split` of size CP > 1) the [b, s] tensors hold this rank's s = S / CP tokens of
// each row (chunks r and 2CP-1-r, in that order), cut after the masks and positions were computed on the
// whole rows; cu_seqlens keeps describing the whole rows (the attention core derives each chunk's view).
#pragma once

#include <cstdint>

#include "megatron/data/document_masks.h"
#include "megatron/parallel/context_parallel.h"
#include "megatron/tensor/tensor.h"

namespace megatron::trainer {

struct HostMicroBatch {
  Tensor tokens, labels, loss_mask, position_ids, cu_seqlens;
  double loss_tokens = 0, row_loss_tokens = 0;
};

HostMicroBatch make_host_micro_batch(const Tensor& samples, int64_t eod, const data::DocumentFlags& flags,
                                     const parallel::SequenceSplit& split, Allocator& host);

// The same from packed conversation rows (--sft; data/sft/sft_packing.h: [b, 2 (S + 1)], the S + 1 tokens then
// their tags): every conversation (and the padding after the last) is a document of cu_seqlens, positions
// restart at 0 in each, and a label counts when its token is trained and belongs to the input's conversation.
// position_ids and cu_seqlens are always defined; the CP cut is as above.
HostMicroBatch make_packed_host_micro_batch(const Tensor& rows, const parallel::SequenceSplit& split, Allocator& host);

// Over the documents of cu_seqlens (host I64 [N + 1]): the sum of their squared lengths (what the attention
// computes, train/flops.h) and the longest.
double document_squares(const Tensor& cu_seqlens);
int64_t longest_document(const Tensor& cu_seqlens);

}  // namespace megatron::trainer
