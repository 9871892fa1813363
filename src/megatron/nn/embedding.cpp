#include "megatron/nn/embedding.h"

#include <vector>

#include "megatron/ops/dropout/dropout.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/embedding/embedding.h"

namespace megatron::nn {

LanguageModelEmbedding::LanguageModelEmbedding(Context& ctx, const ModelConfig& config)
    : init_std_(config.args.init_method_std), seed_(config.seed), dropout_p_(float(config.args.hidden_dropout)) {
  word_embeddings = make_parameter(ctx, "embedding.word_embeddings.weight",
                                   {config.padded_vocab_size, config.hidden()}, config.params_dtype, false);
  if (config.position_embedding() == PositionEmbedding::LearnedAbsolute)
    position_embeddings = make_parameter(ctx, "embedding.position_embeddings.weight",
                                         {config.args.max_position_embeddings, config.hidden()},
                                         config.params_dtype, false);
}

void LanguageModelEmbedding::init(Context& ctx) {
  init_normal(ctx, word_embeddings, seed_, init_std_);
  if (position_embeddings.defined()) init_normal(ctx, position_embeddings, seed_, init_std_);
}

const Tensor& LanguageModelEmbedding::position_ids(Context& ctx, int64_t batch, int64_t seq) {
  if (!position_ids_.defined() || position_ids_.dim(0) != batch || position_ids_.dim(1) != seq) {
    std::vector<int64_t> ids(size_t(batch * seq));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s) ids[size_t(b * seq + s)] = s;
    position_ids_ = ctx.empty({batch, seq}, DType::I64);
    ops::copy(ctx, position_ids_, Tensor::from_blob(ids.data(), {batch, seq}, DType::I64, Device::cpu()));
    ctx.synchronize();  // `ids` dies here; happens once per shape
  }
  return position_ids_;
}

void LanguageModelEmbedding::forward(Context& ctx, const Tensor& out, const Tensor& tokens, bool training,
                                     uint64_t dropout_offset) {
  MEGATRON_CHECK(tokens.rank() == 2, "LanguageModelEmbedding: tokens must be [b, s], got ", tokens.describe());
  active_p_ = training ? dropout_p_ : 0.0f;
  const bool dropout = active_p_ > 0.0f;
  const Tensor sum = dropout ? ctx.empty(out.shape(), out.dtype()) : out;
  ops::embedding_forward(ctx, sum, word_embeddings.value, tokens);
  if (position_embeddings.defined()) {
    MEGATRON_CHECK(tokens.dim(1) <= position_embeddings.value.dim(0), "LanguageModelEmbedding: sequence length ",
                   tokens.dim(1), " exceeds --max-position-embeddings ", position_embeddings.value.dim(0));
    Tensor pos = ctx.empty(out.shape(), out.dtype());
    ops::embedding_forward(ctx, pos, position_embeddings.value, position_ids(ctx, tokens.dim(0), tokens.dim(1)));
    ops::add(ctx, sum, sum, pos);
  }
  if (dropout) ops::dropout_forward(ctx, out, sum, active_p_, seed_, dropout_offset, 0);
  saved_tokens_ = tokens;
  dropout_offset_ = dropout_offset;
}

void LanguageModelEmbedding::backward(Context& ctx, const Tensor& dout) {
  MEGATRON_CHECK(saved_tokens_.defined(), "LanguageModelEmbedding: backward without a forward");
  Tensor dsum = dout;
  if (active_p_ > 0.0f) {
    dsum = ctx.empty(dout.shape(), dout.dtype());
    ops::dropout_backward(ctx, dsum, dout, active_p_, seed_, dropout_offset_, 0);
  }
  ops::embedding_backward(ctx, word_embeddings.main_grad, dsum, saved_tokens_, true);
  if (position_embeddings.defined())
    ops::embedding_backward(ctx, position_embeddings.main_grad, dsum,
                            position_ids(ctx, saved_tokens_.dim(0), saved_tokens_.dim(1)), true);
  saved_tokens_ = Tensor();
}

void LanguageModelEmbedding::collect_parameters(ParameterList& out) {
  out.push_back(&word_embeddings);
  if (position_embeddings.defined()) out.push_back(&position_embeddings);
}

}  // namespace megatron::nn
