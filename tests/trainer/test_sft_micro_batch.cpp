// Micro-batches of packed conversations (--sft): tokens, labels, positions restarting per conversation, the
// conversations (and the padding) as cu_seqlens, and a loss mask on the labels that are trained tokens of the
// input's own conversation, against arrays written out by hand; the CP = 2 cut holds the whole rows' values
// at its global positions. The masked tokens get zero gradient: a Llama-style model's parameter gradients do
// not move when every masked label is changed (bit for bit), do move when one trained label is, and the loss
// is the mean cross-entropy of the model's own logits over the trained labels only.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/data/sft/sft_packing.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/micro_batch.h"

namespace megatron::trainer {
namespace {

data::ConversationTokens conversation(std::vector<int32_t> tokens, std::vector<uint8_t> trained) {
  return {std::move(tokens), std::move(trained)};
}

// Seq 9 (rows of 10): row 0 holds A (4 tokens) and B (3) then 3 padding; row 1 holds C (6) then 4 padding.
Tensor packed_rows() {
  const std::vector<data::ConversationTokens> cs = {conversation({11, 12, 13, 14}, {0, 0, 1, 1}),
                                                    conversation({21, 22, 23}, {0, 1, 1}),
                                                    conversation({31, 32, 33, 34, 35, 36}, {0, 0, 0, 1, 1, 1})};
  const data::PackedConversations p = data::pack_conversations(cs, 9, 7);
  Tensor rows = Tensor::empty(Shape{p.rows(), p.row_width}, DType::I64, testing::cpu_context().allocator());
  std::copy(p.values.begin(), p.values.end(), rows.data<int64_t>());
  return rows;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

TEST(SftMicroBatch, ConversationsAreDocumentsWithAssistantOnlyLoss) {
  Context& ctx = testing::cpu_context();
  const HostMicroBatch mb = make_packed_host_micro_batch(packed_rows(), {1, 0, 9}, ctx.allocator());
  EXPECT_EQ(values<int64_t>(mb.tokens), (std::vector<int64_t>{11, 12, 13, 14, 21, 22, 23, 7, 7,  //
                                                              31, 32, 33, 34, 35, 36, 7, 7, 7}));
  EXPECT_EQ(values<int64_t>(mb.labels), (std::vector<int64_t>{12, 13, 14, 21, 22, 23, 7, 7, 7,  //
                                                              32, 33, 34, 35, 36, 7, 7, 7, 7}));
  EXPECT_EQ(values<float>(mb.loss_mask), (std::vector<float>{0, 1, 1, 0, 1, 1, 0, 0, 0,  //
                                                             0, 0, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(values<int64_t>(mb.position_ids), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 0, 1,  //
                                                                    0, 1, 2, 3, 4, 5, 0, 1, 2}));
  EXPECT_EQ(values<int64_t>(mb.cu_seqlens), (std::vector<int64_t>{0, 4, 7, 9, 15, 18}));
  EXPECT_EQ(mb.loss_tokens, 7.0);
  EXPECT_EQ(mb.row_loss_tokens, 7.0);
}

TEST(SftMicroBatch, ContextParallelCutKeepsTheWholeRowsValues) {
  Context& ctx = testing::cpu_context();
  const Tensor rows = packed_rows();
  // Seq 9 does not split over 2 CP = 4 chunks; rows of 8 inputs do: drop the last token of each row.
  Tensor rows8 = Tensor::empty(Shape{2, 18}, DType::I64, ctx.allocator());
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 9; ++j) {
      rows8.data<int64_t>()[r * 18 + j] = rows.data<int64_t>()[r * 20 + j];
      rows8.data<int64_t>()[r * 18 + 9 + j] = rows.data<int64_t>()[r * 20 + 10 + j];
    }
  const HostMicroBatch whole = make_packed_host_micro_batch(rows8, {1, 0, 8}, ctx.allocator());
  double counted = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const parallel::SequenceSplit split{2, rank, 8};
    const HostMicroBatch mb = make_packed_host_micro_batch(rows8, split, ctx.allocator());
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = 0; j < 4; ++j) {
        const int64_t g = r * 8 + split.global_position(j), l = r * 4 + j;
        EXPECT_EQ(mb.tokens.data<int64_t>()[l], whole.tokens.data<int64_t>()[g]);
        EXPECT_EQ(mb.labels.data<int64_t>()[l], whole.labels.data<int64_t>()[g]);
        EXPECT_EQ(mb.loss_mask.data<float>()[l], whole.loss_mask.data<float>()[g]);
        EXPECT_EQ(mb.position_ids.data<int64_t>()[l], whole.position_ids.data<int64_t>()[g]);
      }
    EXPECT_EQ(values<int64_t>(mb.cu_seqlens), values<int64_t>(whole.cu_seqlens)) << "the whole rows' documents";
    EXPECT_EQ(mb.row_loss_tokens, whole.loss_tokens);
    counted += mb.loss_tokens;
  }
  EXPECT_EQ(counted, whole.loss_tokens);
}

train::ModelArguments llama_args() {
  train::ModelArguments a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.group_query_attention = true;
  a.seq_length = 9;
  a.max_position_embeddings = 16;
  a.vocab_size = 40;
  a.make_vocab_size_divisible_by = 8;
  a.hidden_dropout = 0.0;
  a.attention_dropout = 0.0;
  a.init_method_std = 0.2;
  a.position_embedding_type = "rope";
  a.normalization = "RMSNorm";
  a.swiglu = true;
  a.untie_embeddings_and_output_weights = true;
  a.disable_bias_linear = true;
  return a;
}

// The model's loss and every parameter gradient for `mb` (fp64), its loss the mean over the counted tokens.
std::pair<double, std::vector<double>> loss_and_grads(Context& ctx, nn::GPTModel& model, const HostMicroBatch& mb) {
  for (nn::Parameter* p : model.parameters()) ops::fill(ctx, p->main_grad, 0.0);
  const nn::StageInput in{.tokens = mb.tokens, .labels = mb.labels, .loss_mask = mb.loss_mask,
                          .position_ids = mb.position_ids, .cu_seqlens = mb.cu_seqlens};
  nn::StageOutput out = model.forward(ctx, in, {.training = true, .loss_denominator = mb.loss_tokens});
  const double loss = testing::to_doubles(ctx, out.loss)[0];
  model.backward(ctx, std::move(out.saved));
  std::vector<double> grads;
  for (nn::Parameter* p : model.parameters()) {
    const std::vector<double> g = testing::to_doubles(ctx, p->main_grad);
    grads.insert(grads.end(), g.begin(), g.end());
  }
  return {loss, grads};
}

TEST(SftMicroBatch, MaskedTokensGetZeroGradient) {
  Context& ctx = testing::cpu_context();
  const train::ModelArguments args = llama_args();
  nn::GPTModel model(ctx, train::transformer_config(args, DType::F64, 5));
  HostMicroBatch mb = make_packed_host_micro_batch(packed_rows(), {1, 0, 9}, ctx.allocator());
  const auto [loss, grads] = loss_and_grads(ctx, model, mb);

  // The reference loss: log-softmax of the model's logits at the trained labels only.
  nn::StageInput no_labels{.tokens = mb.tokens, .position_ids = mb.position_ids, .cu_seqlens = mb.cu_seqlens};
  const Tensor logits = model.forward(ctx, no_labels, {.training = false}).logits;
  const std::vector<double> z = testing::to_doubles(ctx, logits);
  const int64_t V = logits.dim(-1);
  double sum = 0, counted = 0;
  for (int64_t t = 0; t < mb.tokens.numel(); ++t) {
    if (mb.loss_mask.data<float>()[t] == 0) continue;
    double m = -1e300, e = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[size_t(t * V + v)]);
    for (int64_t v = 0; v < V; ++v) e += std::exp(z[size_t(t * V + v)] - m);
    sum += m + std::log(e) - z[size_t(t * V + mb.labels.data<int64_t>()[t])];
    ++counted;
  }
  EXPECT_NEAR(loss, sum / counted, 1e-12 * loss);

  HostMicroBatch masked_changed = make_packed_host_micro_batch(packed_rows(), {1, 0, 9}, ctx.allocator());
  int64_t first_trained = -1;
  for (int64_t t = 0; t < mb.labels.numel(); ++t) {
    if (masked_changed.loss_mask.data<float>()[t] == 0)
      masked_changed.labels.data<int64_t>()[t] = (mb.labels.data<int64_t>()[t] + 5 + t) % args.vocab_size;
    else if (first_trained < 0)
      first_trained = t;
  }
  const auto [loss2, grads2] = loss_and_grads(ctx, model, masked_changed);
  EXPECT_EQ(loss2, loss);
  EXPECT_EQ(grads2, grads) << "a masked label must not reach any gradient";

  masked_changed.labels.data<int64_t>()[first_trained] = (mb.labels.data<int64_t>()[first_trained] + 1) % 40;
  const auto [loss3, grads3] = loss_and_grads(ctx, model, masked_changed);
  EXPECT_NE(loss3, loss);
  EXPECT_NE(grads3, grads) << "the test must see a trained label's gradient";
}

}  // namespace
}  // namespace megatron::trainer
