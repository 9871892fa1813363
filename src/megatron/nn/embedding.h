// LanguageModelEmbedding: token (+ learned absolute position) embeddings, then embedding dropout
// (Megatron uses --hidden-dropout here).
//
// Parameters: "embedding.word_embeddings.weight" [padded V, h] (a VocabParallelEmbedding: split by rows over
// TP); with learned_absolute positions "embedding.position_embeddings.weight" [max_position_embeddings, h]
// (replicated over TP). Both normal(0, init_method_std), both weight-decayed (Megatron's rule exempts only
// biases and 1-D tensors).
// forward(ctx, out, tokens, training, dropout_offset, position_offset): tokens [b, s] I32/I64 -> out
//   assigned: [b, s, h], or under sequence parallelism this rank's token rows [b * s / TP, h]
//   (tensor_parallel.h): out = dropout(word[tokens] + pos[position_offset + s]) for token s of each row (the
//   offset: generation's later tokens), the word lookup summed over TP first (all-reduce, or
//   reduce-scatter under SP, so only this rank's rows get their positions and dropout);
//   dropout is Philox (config.seed, dropout_offset) addressed by the element's index in the whole micro-batch
//   (nn/dropout_rows.h), so the mask of every element is the one-rank mask whatever the layout; no dropout
//   when !training. Under context parallelism tokens holds this rank's tokens of each sequence and the
//   learned positions are their original positions (parallel/context_parallel.h's split). `position_ids`
//   ([b, s] I64 on the device, optional): each token's position instead (--reset-position-ids: positions
//   restart in every document); position_offset must then be 0.
//   Returns what backward needs (the token and position ids, the dropout addressing). Position ids are a
//   workspace cached per (b, s).
// backward(ctx, saved, dout): dout like out. word.main_grad += scatter of dropout'(dout) by token (deterministic; this
//   rank's vocabulary rows), positions likewise from the gradient of all rows (all-gathered under SP, so the
//   replicated position table gets the same whole gradient on every TP rank). The tied output layer adds its
//   gradient into word_embeddings.main_grad separately.
#pragma once

#include "megatron/nn/dropout_rows.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/nn/parameter.h"
#include "megatron/nn/vocab_parallel_embedding.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

struct EmbeddingSaved {
  Tensor tokens;          // [b, s]
  Tensor position_ids;    // [b, s]; learned positions only
  DropoutRows dropout;    // p = 0: none
};

class LanguageModelEmbedding {
 public:
  LanguageModelEmbedding() = default;
  // `word_placement`: the word embeddings' placement beyond their TP split (shared_embedding when a pipeline's
  // last stage holds a tied copy).
  LanguageModelEmbedding(Context& ctx, const TransformerConfig& config, const parallel::TensorParallel& tp = {},
                         Placement word_placement = {}, const parallel::ContextParallel& cp = {});

  void init(Context& ctx);
  [[nodiscard]] EmbeddingSaved forward(Context& ctx, const Tensor& out, const Tensor& tokens, bool training,
                                       uint64_t dropout_offset, int64_t position_offset = 0,
                                       const Tensor& position_ids = Tensor()) const;
  void backward(Context& ctx, EmbeddingSaved&& saved, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  VocabParallelEmbedding word_embeddings;  // its Parameter: word_embeddings.weight
  Parameter position_embeddings;           // learned_absolute only

 private:
  Tensor position_ids(Context& ctx, int64_t batch, int64_t seq, int64_t offset) const;

  parallel::TensorParallel tp_;
  parallel::ContextParallel cp_;
  double init_std_ = 0.02;
  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  // Workspace: [b, s] I64 on the device, each row's positions (offset + the split's position of each local
  // token), for the last (b, s, offset).
  mutable Tensor position_ids_;
  mutable int64_t position_offset_ = 0;
};

}  // namespace megatron::nn
