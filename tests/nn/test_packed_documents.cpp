// A micro-batch whose rows hold several documents, with Megatron's --reset-position-ids and
// --reset-attention-mask (positions restart in every document, attention stays inside it), computes the
// function of its documents run one at a time as sequences of their own: the same logits for every token, the
// same loss, and the same gradient of every parameter (fp64, CPU), for a GPT-style model (learned positions,
// multi-head attention) and a Llama-style one (RoPE, grouped-query attention).
#include <gtest/gtest.h>

#include <vector>

#include "harness.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/train/model_config.h"
#include "microbatch_checks.h"
#include "model_batches.h"

namespace megatron::nn {
namespace {

constexpr int64_t kRows = 2, kSeq = 12;
// Row 0: documents of 5, 1 and 6 tokens; row 1: 4 and 8.
const std::vector<std::vector<int64_t>> kDocuments = {{5, 1, 6}, {4, 8}};

Tensor host_i64(Context& ctx, const std::vector<int64_t>& v, const Shape& shape) {
  Tensor t = ctx.empty(shape, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

// Rows [begin, end) of token t of row `row` of a [b, s] tensor, as a [1, end - begin] tensor.
Tensor piece(Context& ctx, const Tensor& t, int64_t row, int64_t begin, int64_t end) {
  Tensor out = ctx.empty({1, end - begin}, t.dtype());
  ops::copy(ctx, out.view({end - begin}), t.select(row).slice(begin, end));
  return out;
}

std::vector<double> grads(Context& ctx, GPTModel& model) {
  std::vector<double> all;
  for (Parameter* p : model.parameters()) {
    const std::vector<double> g = testing::to_doubles(ctx, p->main_grad);
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * scale) << what << " element " << i;
}

void expect_packed_equals_documents(train::ModelArguments args) {
  Context& ctx = testing::cpu_context();
  args.hidden_dropout = 0.0;
  args.seq_length = kSeq;
  const TransformerConfig config = train::transformer_config(args, DType::F64, 77);
  GPTModel model(ctx, config);
  const testing::ModelBatch batch = testing::make_model_batch(ctx, kRows, kSeq, args.vocab_size, 31);
  std::vector<int64_t> positions, cu = {0};
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t len : kDocuments[size_t(r)]) {
      for (int64_t j = 0; j < len; ++j) positions.push_back(j);
      cu.push_back(cu.back() + len);
    }
  double counted = 0;
  for (int64_t i = 0; i < kRows * kSeq; ++i) counted += batch.mask.data<float>()[i];

  // Packed: one micro-batch, its loss the mean over every counted token.
  const StageInput packed{.tokens = batch.tokens, .labels = batch.labels, .loss_mask = batch.mask,
                          .position_ids = host_i64(ctx, positions, {kRows, kSeq}),
                          .cu_seqlens = host_i64(ctx, cu, {int64_t(cu.size())})};
  zero_grads(ctx, model.parameters());
  StageOutput out = model.forward(ctx, packed, {.training = true, .loss_denominator = counted});
  const double packed_loss = read_scalar(ctx, out.loss);
  model.backward(ctx, std::move(out.saved));
  const std::vector<double> packed_grads = grads(ctx, model);
  StageInput packed_logits_input = packed;
  packed_logits_input.labels = Tensor();
  const std::vector<double> packed_logits =
      testing::to_doubles(ctx, model.forward(ctx, packed_logits_input, {.training = false}).logits);

  // One document at a time: gradients of sum(loss * mask) / counted add up; logits row by row.
  zero_grads(ctx, model.parameters());
  double summed_loss = 0;
  std::vector<double> logits;
  for (int64_t r = 0; r < kRows; ++r) {
    int64_t begin = 0;
    for (int64_t len : kDocuments[size_t(r)]) {
      const StageInput doc{.tokens = piece(ctx, batch.tokens, r, begin, begin + len),
                           .labels = piece(ctx, batch.labels, r, begin, begin + len),
                           .loss_mask = piece(ctx, batch.mask, r, begin, begin + len)};
      double doc_counted = 0;
      for (double m : testing::to_doubles(ctx, doc.loss_mask)) doc_counted += m;
      StageOutput d = model.forward(ctx, doc, {.training = true, .loss_denominator = counted});
      summed_loss += read_scalar(ctx, d.loss) * doc_counted;
      model.backward(ctx, std::move(d.saved));
      StageInput no_labels = doc;
      no_labels.labels = Tensor();
      const std::vector<double> l = testing::to_doubles(ctx, model.forward(ctx, no_labels, {.training = false}).logits);
      logits.insert(logits.end(), l.begin(), l.end());
      begin += len;
    }
  }
  EXPECT_NEAR(packed_loss, summed_loss / counted, 1e-12 * std::abs(packed_loss));
  expect_close(packed_logits, logits, 1e-12, "logits");
  expect_close(packed_grads, grads(ctx, model), 1e-10, "gradients");

  // Without the document boundaries the packed rows are one sequence each: not the documents' function.
  StageInput whole_rows = packed_logits_input;
  whole_rows.cu_seqlens = Tensor();
  const std::vector<double> mixed = testing::to_doubles(ctx, model.forward(ctx, whole_rows, {.training = false}).logits);
  double differs = 0;
  for (size_t i = 0; i < mixed.size(); ++i) differs = std::max(differs, std::abs(mixed[i] - logits[i]));
  EXPECT_GT(differs, 1e-3) << "the test must be able to tell attention across documents apart";
}

TEST(PackedDocuments, GptStyleEqualsDocumentsOneByOne) { expect_packed_equals_documents(microbatch::gpt2_args()); }
TEST(PackedDocuments, LlamaStyleEqualsDocumentsOneByOne) { expect_packed_equals_documents(microbatch::llama_args()); }

// Attention dropout over packed documents draws, for each document, the masks its scores have in the whole
// micro-batch: where every document is a whole sample, the packed model computes exactly the unpacked one
// (loss and gradients, with attention and hidden dropout on), and not the model without attention dropout.
TEST(PackedDocuments, AttentionDropoutOverWholeSampleDocumentsEqualsTheUnpackedModel) {
  Context& ctx = testing::cpu_context();
  train::ModelArguments args = microbatch::llama_args();
  args.seq_length = kSeq;
  args.hidden_dropout = 0.1;
  args.attention_dropout = 0.2;
  GPTModel model(ctx, train::transformer_config(args, DType::F64, 77));
  const testing::ModelBatch batch = testing::make_model_batch(ctx, kRows, kSeq, args.vocab_size, 41);
  double counted = 0;
  for (int64_t i = 0; i < kRows * kSeq; ++i) counted += batch.mask.data<float>()[i];
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < kSeq; ++j) positions.push_back(j);
  std::vector<int64_t> cu = {0};
  for (int64_t r = 0; r < kRows; ++r) cu.push_back(cu.back() + kSeq);
  auto loss_and_grads = [&](GPTModel& m, bool packed) {
    StageInput in{.tokens = batch.tokens, .labels = batch.labels, .loss_mask = batch.mask};
    if (packed) {
      in.position_ids = host_i64(ctx, positions, {kRows, kSeq});
      in.cu_seqlens = host_i64(ctx, cu, {int64_t(cu.size())});
    }
    zero_grads(ctx, m.parameters());
    StageOutput out = m.forward(ctx, in, {.training = true, .loss_denominator = counted});
    const double loss = read_scalar(ctx, out.loss);
    m.backward(ctx, std::move(out.saved));
    std::vector<double> all = grads(ctx, m);
    all.push_back(loss);
    return all;
  };
  const std::vector<double> packed = loss_and_grads(model, true), unpacked = loss_and_grads(model, false);
  expect_close(packed, unpacked, 1e-12, "loss and gradients");

  train::ModelArguments no_attention_dropout = args;
  no_attention_dropout.attention_dropout = 0.0;
  GPTModel other(ctx, train::transformer_config(no_attention_dropout, DType::F64, 77));
  const std::vector<double> without = loss_and_grads(other, true);
  double differs = 0;
  for (size_t i = 0; i < without.size(); ++i) differs = std::max(differs, std::abs(without[i] - packed[i]));
  EXPECT_GT(differs, 1e-6) << "attention dropout must act on the packed path";
}

}  // namespace
}  // namespace megatron::nn
