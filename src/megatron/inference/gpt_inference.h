// GPTInference: the forward pass of an nn::GPTModel for generation, with a key/value cache.
//
// It reads the model's parameters (never changes them) and calls the ops directly, the same computation as
// GPTModel's training forward without dropout: embedding (+ learned positions at their absolute positions),
// per layer pre-norm -> fused QKV -> RoPE at absolute positions -> attention over the cache -> proj ->
// residual -> pre-norm -> MLP -> residual, final norm, output layer.
//
// forward(ctx, tokens): tokens [B, S] (I32/I64, host or device) are the next S tokens of every sequence, at
// positions length() .. length() + S - 1. Their keys and values are appended to the cache; returns the
// logits [B, S, padded V] in F32 on ctx's device. A first call with the whole prompt is the prefill; later
// calls with S = 1 decode one token each. reset() empties the cache. length() + S must not exceed
// max_length (checked; the cache is allocated once: 2 x layers x B x max_length x groups x head_dim).
#pragma once

#include <vector>

#include "megatron/nn/gpt_model.h"

namespace megatron::inference {

class GPTInference {
 public:
  GPTInference(Context& ctx, nn::GPTModel& model, int64_t batch, int64_t max_length);

  Tensor forward(Context& ctx, const Tensor& tokens);
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t max_length() const { return max_length_; }
  int64_t batch() const { return batch_; }

 private:
  Tensor norm(Context& ctx, const nn::Norm& n, const Tensor& x);

  nn::GPTModel& model_;
  int64_t batch_, max_length_, length_ = 0;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [B, max_length, G, D]
};

}  // namespace megatron::inference
