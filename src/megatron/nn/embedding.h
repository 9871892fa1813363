// LanguageModelEmbedding: token (+ learned absolute position) embeddings, then embedding dropout
// (Megatron uses --hidden-dropout here).
//
// Parameters: "embedding.word_embeddings.weight" [padded V, h]; with learned_absolute positions
// "embedding.position_embeddings.weight" [max_position_embeddings, h]. Both normal(0, init_method_std),
// both weight-decayed (Megatron's rule exempts only biases and 1-D tensors).
// forward(ctx, out, tokens, training, dropout_offset): tokens [b, s] I32/I64 -> out [b, s, h] assigned:
//   out = dropout(word[tokens] + pos[0..s)), Philox (config.seed, dropout_offset, index_base 0); no dropout
//   when !training.
//   Saves tokens (handle). Position ids are cached per (b, s).
// backward(ctx, dout): word.main_grad += scatter of dropout'(dout) by token (deterministic), positions
//   likewise. The tied output layer adds its gradient into word_embeddings.main_grad separately.
#pragma once

#include "megatron/nn/config.h"
#include "megatron/nn/parameter.h"

namespace megatron::nn {

class LanguageModelEmbedding {
 public:
  LanguageModelEmbedding() = default;
  LanguageModelEmbedding(Context& ctx, const ModelConfig& config);

  void init(Context& ctx);
  void forward(Context& ctx, const Tensor& out, const Tensor& tokens, bool training, uint64_t dropout_offset);
  void backward(Context& ctx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  Parameter word_embeddings;
  Parameter position_embeddings;  // learned_absolute only

 private:
  const Tensor& position_ids(Context& ctx, int64_t batch, int64_t seq);

  double init_std_ = 0.02;
  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  float active_p_ = 0.0f;  // dropout_p_ in training, 0 in eval
  uint64_t dropout_offset_ = 0;
  Tensor saved_tokens_;
  Tensor position_ids_;  // [b, s] I64 on the device: 0..s-1 per row
};

}  // namespace megatron::nn
