#include "megatron/nn/embedding.h"

#include <vector>

#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/embedding/embedding.h"

namespace megatron::nn {

LanguageModelEmbedding::LanguageModelEmbedding(Context& ctx, const TransformerConfig& config,
                                               const parallel::TensorParallel& tp, Placement word_placement,
                                               const parallel::ContextParallel& cp)
    : word_embeddings(ctx, "embedding.word_embeddings.weight", config.padded_vocab_size, config.hidden(),
                      config.params_dtype, tp, word_placement),
      tp_(tp),
      cp_(cp),
      init_std_(config.init_method_std),
      seed_(config.seed),
      dropout_p_(float(config.hidden_dropout)) {
  if (config.position_embedding == PositionEmbedding::LearnedAbsolute)
    position_embeddings = make_parameter(ctx, "embedding.position_embeddings.weight",
                                         {config.max_position_embeddings, config.hidden()}, config.params_dtype,
                                         false, {.tp = {.dim = -1, .blocks = 1, .rank = tp.rank(), .size = tp.size()}});
}

void LanguageModelEmbedding::init(Context& ctx) {
  init_normal(ctx, word_embeddings.weight, seed_, init_std_);
  if (position_embeddings.defined()) init_normal(ctx, position_embeddings, seed_, init_std_);
}

Tensor LanguageModelEmbedding::position_ids(Context& ctx, int64_t batch, int64_t seq, int64_t offset) const {
  if (!position_ids_.defined() || position_ids_.dim(0) != batch || position_ids_.dim(1) != seq ||
      position_offset_ != offset) {
    const parallel::SequenceSplit split = cp_.split(seq * cp_.size());
    std::vector<int64_t> ids(size_t(batch * seq));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s) ids[size_t(b * seq + s)] = offset + split.global_position(s);
    position_offset_ = offset;
    position_ids_ = ctx.empty({batch, seq}, DType::I64);
    ops::copy(ctx, position_ids_, Tensor::from_blob(ids.data(), {batch, seq}, DType::I64, Device::cpu()));
    ctx.synchronize();  // `ids` dies here; happens once per shape
  }
  return position_ids_;
}

EmbeddingSaved LanguageModelEmbedding::forward(Context& ctx, const Tensor& out, const Tensor& tokens, bool training,
                                               uint64_t dropout_offset, int64_t position_offset,
                                               const Tensor& given_position_ids) const {
  MEGATRON_CHECK(tokens.rank() == 2, "LanguageModelEmbedding: tokens must be [b, s], got ", tokens.describe());
  const int64_t b = tokens.dim(0), s = tokens.dim(1), T = b * s, h = word_embeddings.weight.value.dim(1);
  const int64_t rows = tp_.sp_rows(T), first = tp_.sp_row_offset(T);
  MEGATRON_CHECK(out.numel() == rows * h, "LanguageModelEmbedding: out ", out.describe(), " must hold ", rows,
                 " token rows of ", h, " for tokens ", tokens.describe());
  EmbeddingSaved saved{.tokens = tokens};
  const bool dropout = training && dropout_p_ > 0.0f;
  if (dropout)
    saved.dropout = {.p = dropout_p_, .seed = seed_, .offset = dropout_offset, .runs = activation_rows(tp_, cp_, b, s)};
  const Tensor sum = dropout ? ctx.empty(out.shape(), out.dtype()) : out;
  word_embeddings.forward(ctx, sum, tokens);
  if (position_embeddings.defined()) {
    const int64_t last = position_offset + s * cp_.size();
    MEGATRON_CHECK(last <= position_embeddings.value.dim(0), "LanguageModelEmbedding: positions up to ", last,
                   " exceed --max-position-embeddings ", position_embeddings.value.dim(0));
    MEGATRON_CHECK(!given_position_ids.defined() ||
                       (given_position_ids.shape() == tokens.shape() && position_offset == 0),
                   "LanguageModelEmbedding: position ids ", given_position_ids.describe(), " must be [b, s] like tokens ",
                   tokens.describe(), " (and no position offset)");
    saved.position_ids = given_position_ids.defined() ? given_position_ids : position_ids(ctx, b, s, position_offset);
    Tensor pos = ctx.empty(out.shape(), out.dtype());
    const Tensor ids = saved.position_ids.view({T}).slice(first, first + rows);  // this rank's rows
    ops::embedding_forward(ctx, pos.view({rows, h}), position_embeddings.value, ids);
    ops::add(ctx, sum, sum, pos);
  }
  if (dropout) dropout_rows_forward(ctx, out, sum, saved.dropout);
  return saved;
}

void LanguageModelEmbedding::backward(Context& ctx, EmbeddingSaved&& saved, const Tensor& dout) {
  const EmbeddingSaved e = std::move(saved);
  Tensor dsum = dout;
  if (e.dropout.p > 0.0f) {
    dsum = ctx.empty(dout.shape(), dout.dtype());
    dropout_rows_backward(ctx, dsum, dout, e.dropout);
  }
  const Tensor dwhole = word_embeddings.backward(ctx, e.tokens, dsum);  // [T, h]: every token's gradient
  if (position_embeddings.defined()) {
    const Tensor& ids = e.position_ids;  // [b, s]
    ops::embedding_backward(ctx, position_embeddings.main_grad,
                            dwhole.view({ids.dim(0), ids.dim(1), dwhole.dim(1)}), ids, true);
  }
}

void LanguageModelEmbedding::collect_parameters(ParameterList& out) {
  out.push_back(&word_embeddings.weight);
  if (position_embeddings.defined()) out.push_back(&position_embeddings);
}

}  // namespace megatron::nn
