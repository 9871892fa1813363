// LanguageModelEmbedding: token (+ learned absolute position) embeddings, then embedding dropout
// (Megatron uses --hidden-dropout here).
//
// Parameters: "embedding.word_embeddings.weight" [padded V, h] (a VocabParallelEmbedding: split by rows over
// TP); with learned_absolute positions "embedding.position_embeddings.weight" [max_position_embeddings, h]
// (replicated over TP). Both normal(0, init_method_std), both weight-decayed (Megatron's rule exempts only
// biases and 1-D tensors).
// forward(ctx, out, tokens, training, dropout_offset): tokens [b, s] I32/I64 -> out assigned: [b, s, h], or
//   under sequence parallelism this rank's token rows [b * s / TP, h] (tensor_parallel.h):
//   out = dropout(word[tokens] + pos[position]), the word lookup summed over TP first (all-reduce, or
//   reduce-scatter under SP, so only this rank's rows get their positions and dropout);
//   dropout is Philox (config.seed, dropout_offset) addressed by the element's index in the whole [b * s, h]
//   tensor, so the mask of every element is the TP = 1 mask whatever the layout; no dropout when !training.
//   Saves tokens (handle). Position ids are cached per (b, s).
// backward(ctx, dout): dout like out. word.main_grad += scatter of dropout'(dout) by token (deterministic; this
//   rank's vocabulary rows), positions likewise from the gradient of all rows (all-gathered under SP, so the
//   replicated position table gets the same whole gradient on every TP rank). The tied output layer adds its
//   gradient into word_embeddings.main_grad separately.
#pragma once

#include "megatron/nn/config.h"
#include "megatron/nn/parameter.h"
#include "megatron/nn/vocab_parallel_embedding.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

class LanguageModelEmbedding {
 public:
  LanguageModelEmbedding() = default;
  LanguageModelEmbedding(Context& ctx, const ModelConfig& config, const parallel::TensorParallel& tp = {});

  void init(Context& ctx);
  void forward(Context& ctx, const Tensor& out, const Tensor& tokens, bool training, uint64_t dropout_offset);
  void backward(Context& ctx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  VocabParallelEmbedding word_embeddings;  // its Parameter: word_embeddings.weight
  Parameter position_embeddings;           // learned_absolute only

 private:
  const Tensor& position_ids(Context& ctx, int64_t batch, int64_t seq);

  parallel::TensorParallel tp_;
  double init_std_ = 0.02;
  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  float active_p_ = 0.0f;  // dropout_p_ in training, 0 in eval
  uint64_t dropout_offset_ = 0;
  uint64_t dropout_index_base_ = 0;
  Tensor position_ids_;  // [b, s] I64 on the device: 0..s-1 per row
};

}  // namespace megatron::nn
