// Tensor and sequence parallelism of GPTModel against the TP = 1 model, under `mpiexec -np 4`: TP = 2 (two
// independent groups of two inside the world of four) and TP = 4, each without and with sequence
// parallelism, with dropout off and on, for a GPT-style model (LayerNorm, GELU, learned positions, biases,
// tied, GQA), the same with MHA (the packed attention path) and a Llama-style model (RMSNorm, SwiGLU,
// partial RoPE, untied, no bias, GQA), all with a vocabulary (37) not divisible by TP and a micro-batch of 2
// (so sequence-parallel shards hold rows of both sequences). Every rank builds the TP = 1 model itself from the
// same configuration and checks, in fp32:
//   - every parameter's local values are exactly its piece of the TP = 1 parameter (Philox init addressed by
//     whole-tensor element index), located by describe_shard's global offsets;
//   - the pieces of every parameter cover it exactly once over the TP group (replicas marked);
//   - the loss equals the TP = 1 loss and every gradient piece the TP = 1 gradient's piece within 1e-5 relative
//     (dropout on: the same masks, or the losses would differ by far more);
//   - replicated parameters get bit-identical gradients on every TP rank.
// Column-/row-parallel linears in every mode (gather_output, input_is_parallel, SP) are checked against
// the TP = 1 layer on the whole tensors. Suite TensorParallelGpu: TP over every rank (2, 4 or 8 GPUs) with and without SP (NCCL, overlapped
// collectives) in bf16 against TP = 1 on each rank's GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>

#include "harness.h"
#include "model_batches.h"
#include "megatron/distributed/finalize_model_grads.h"
#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/nn/row_parallel_linear.h"
#include "megatron/nn/parameter_shard.h"
#include "megatron/train/model_config.h"
#include "mpi_world.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#endif

namespace megatron::nn {
namespace {

train::ModelArguments gpt_args() {
  train::ModelArguments a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.num_attention_heads = 8;
  a.num_query_groups = 4;
  a.group_query_attention = true;
  a.kv_channels = 4;
  a.ffn_hidden_size = 64;
  a.seq_length = 8;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.hidden_dropout = 0.0;
  a.attention_dropout = 0.0;
  return a;
}
train::ModelArguments gpt_mha_args() {
  train::ModelArguments a = gpt_args();
  a.num_query_groups = 8;  // MHA without RoPE: the packed attention path
  a.group_query_attention = false;
  return a;
}
train::ModelArguments llama_args() {
  train::ModelArguments a = gpt_args();
  a.position_embedding_type = "rope";
  a.rotary_percent = 0.5;
  a.normalization = "RMSNorm";
  a.swiglu = true;
  a.ffn_hidden_size = 40;
  a.untie_embeddings_and_output_weights = true;
  a.disable_bias_linear = true;
  return a;
}

using Batch = testing::ModelBatch;
Batch make_batch(Context& ctx, int64_t b, int64_t s, int64_t vocab) {
  return testing::make_model_batch(ctx, b, s, vocab, testing::seed_from("tp batch"));
}

// Random values of a useful size for every parameter, drawn by whole-tensor index (so every layout draws the
// same): norm weights around 1, biases and weights around 0.
void randomize(Context& ctx, GPTModel& model) {
  for (Parameter* p : model.parameters()) {
    const bool norm_weight = p->name.find("layernorm.weight") != std::string::npos;
    fill_parameter_normal(ctx, *p, 99, parameter_name_hash(p->name), norm_weight ? 1.0 : 0.0, 0.2);
  }
}

// Element [i] (row-major) of `local` mapped to its index in the whole tensor, for every box.
template <class Fn>
void for_each_element(const ParameterShard& s, const std::vector<int64_t>& local_shape, Fn&& fn) {
  const int rank = int(s.global_shape.size());
  for (const ShardBox& box : s.boxes) {
    const int64_t rows = box.shape[0], cols = rank == 2 ? box.shape[1] : 1;
    const int64_t local_cols = rank == 2 ? local_shape[1] : 1, global_cols = rank == 2 ? s.global_shape[1] : 1;
    const int64_t lr0 = s.dim == 0 ? box.local_offset : 0, lc0 = s.dim == 1 ? box.local_offset : 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t local = (lr0 + r) * local_cols + lc0 + c;
        const int64_t global = (box.global_offset[0] + r) * global_cols + (rank == 2 ? box.global_offset[1] : 0) + c;
        fn(local, global);
      }
  }
}

// What finalize_model_grads does for TP: the gradients that are partial over TP (the norms under sequence
// parallelism) summed over the TP group.
void sum_partial_grads_over_tp(Context& ctx, GPTModel& model) {
  ParameterList partial;
  for (Parameter* p : model.parameters())
    if (p->placement.grad_partial_over_tp) partial.push_back(p);
  if (!partial.empty()) distributed::all_reduce_grads(ctx, partial, *model.tensor_parallel().group);
}

struct Reference {
  double loss = 0;
  std::map<std::string, std::vector<double>> values, grads;
  std::map<std::string, std::vector<int64_t>> shapes;
};

Reference run_reference(const TransformerConfig& config, const Batch& batch, uint64_t dropout_step) {
  Context& ctx = testing::cpu_context();
  GPTModel model(ctx, config);
  randomize(ctx, model);
  Reference ref;
  ref.loss = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = dropout_step});
  for (Parameter* p : model.parameters()) {
    ref.values[p->name] = testing::to_doubles(ctx, p->value);
    ref.grads[p->name] = testing::to_doubles(ctx, p->main_grad);
    ref.shapes[p->name] = p->value.shape().dims();
  }
  return ref;
}

void expect_matches_reference(GPTModel& model, const Reference& ref, double loss, comm::Communicator& group,
                              const std::string& what) {
  Context& ctx = testing::cpu_context();
  EXPECT_LE(std::fabs(loss - ref.loss), 1e-5 * std::fabs(ref.loss)) << what << ": loss " << loss << " vs TP=1 " << ref.loss;
  ParameterList params = model.parameters();
  ASSERT_EQ(params.size(), ref.values.size()) << what;
  for (Parameter* p : params) {
    ASSERT_TRUE(ref.values.count(p->name)) << what << ": " << p->name << " is not a TP=1 parameter";
    const ParameterShard shard = describe_shard(*p);
    ASSERT_EQ(shard.global_shape, ref.shapes.at(p->name)) << what << ": " << p->name;
    const std::vector<double> value = testing::to_doubles(ctx, p->value), grad = testing::to_doubles(ctx, p->main_grad);
    const std::vector<double>& ref_value = ref.values.at(p->name);
    const std::vector<double>& ref_grad = ref.grads.at(p->name);
    // Coverage: every element of the whole tensor held by exactly one non-replica piece of the group.
    std::vector<double> count(ref_value.size(), 0.0);
    size_t value_mismatches = 0, elements = 0;
    double diff2 = 0, ref2 = 0;
    for_each_element(shard, p->value.shape().dims(), [&](int64_t local, int64_t global) {
      ++elements;
      if (!shard.replica) count[size_t(global)] += 1;
      value_mismatches += value[size_t(local)] != ref_value[size_t(global)];
      const double d = grad[size_t(local)] - ref_grad[size_t(global)];
      diff2 += d * d;
      ref2 += ref_grad[size_t(global)] * ref_grad[size_t(global)];
    });
    EXPECT_EQ(elements, value.size()) << what << ": " << p->name << " boxes do not cover the local tensor";
    EXPECT_EQ(value_mismatches, 0u) << what << ": " << p->name << " is not the TP=1 parameter's piece";
    EXPECT_GT(ref2, 0.0) << what << ": " << p->name << " has no gradient";
    EXPECT_LE(std::sqrt(diff2), 1e-5 * std::sqrt(ref2)) << what << ": gradient of " << p->name;
    group.all_reduce_host(count, comm::ReduceOp::Sum);
    size_t wrong = 0;
    for (double c : count) wrong += c != 1.0;
    EXPECT_EQ(wrong, 0u) << what << ": " << p->name << " pieces do not cover the whole tensor exactly once";
    if (!p->placement.tp.sharded()) {  // replicated: the same gradient bits on every TP rank
      std::vector<double> hi = grad, lo = grad;
      for (double& v : lo) v = -v;
      group.all_reduce_host(hi, comm::ReduceOp::Max);
      group.all_reduce_host(lo, comm::ReduceOp::Max);
      size_t differ = 0;
      for (size_t k = 0; k < hi.size(); ++k) differ += hi[k] != -lo[k];
      EXPECT_EQ(differ, 0u) << what << ": replicated " << p->name << " has different gradients across TP ranks";
    }
  }
}

// Rows [r0, r0 + n) and columns [c0, c0 + m) of a row-major [*, cols] matrix.
std::vector<double> block(const std::vector<double>& whole, int64_t cols, int64_t r0, int64_t n, int64_t c0, int64_t m) {
  std::vector<double> out;
  for (int64_t r = r0; r < r0 + n; ++r)
    for (int64_t c = c0; c < c0 + m; ++c) out.push_back(whole[size_t(r * cols + c)]);
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < got.size(); ++i) diff2 += (got[i] - want[i]) * (got[i] - want[i]), ref2 += want[i] * want[i];
  EXPECT_GT(ref2, 0.0) << what;
  EXPECT_LE(std::sqrt(diff2), 1e-6 * std::sqrt(ref2)) << what;
}

// ColumnParallelLinear (with and without gather_output) and RowParallelLinear (with and without
// input_is_parallel), each with and without sequence parallelism, against the TP = 1 layer on the whole tensors:
// outputs, input gradients and parameter gradient pieces.
TEST(TensorParallel, ParallelLinearsMatchLinear) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  const int P = world->size(), me = world->rank();
  const int64_t T = 4 * P, in = 3 * P, out = 2 * P;
  Tensor x = ctx.empty({T, in}, DType::F64), dy = ctx.empty({T, out}, DType::F64);
  testing::fill_random(x, 1);
  testing::fill_random(dy, 2);
  const std::vector<double> xv = testing::to_doubles(ctx, x), dyv = testing::to_doubles(ctx, dy);
  // The whole layer, initialised like the parallel ones (same names, whole-tensor indices), bias made non-zero.
  auto reference = [&](const std::string& name, std::vector<double>& y, std::vector<double>& dx,
                       std::vector<double>& dw, std::vector<double>& db) {
    ColumnParallelLinear whole(ctx, name, in, out, true, DType::F64, parallel::TensorParallel{});  // TP = 1: plain
    whole.init(ctx, 3, 0.5);
    fill_parameter_normal(ctx, whole.bias, 3, 77, 0.0, 0.5);
    Tensor yt = ctx.empty({T, out}, DType::F64), dxt = ctx.empty({T, in}, DType::F64);
    LinearSaved saved = whole.forward(ctx, yt, x);
    whole.backward(ctx, std::move(saved), dxt, dy);
    y = testing::to_doubles(ctx, yt), dx = testing::to_doubles(ctx, dxt);
    dw = testing::to_doubles(ctx, whole.weight.main_grad), db = testing::to_doubles(ctx, whole.bias.main_grad);
  };
  auto piece = [&](const Parameter& p, const std::vector<double>& whole) {
    std::vector<double> got(size_t(p.value.numel()));
    for_each_element(describe_shard(p), p.value.shape().dims(),
                     [&](int64_t local, int64_t global) { got[size_t(local)] = whole[size_t(global)]; });
    return got;
  };
  auto tensor_of = [&](const std::vector<double>& v, std::vector<int64_t> shape) {
    Tensor t = ctx.empty(Shape(shape), DType::F64);
    std::copy(v.begin(), v.end(), t.data<double>());
    return t;
  };
  for (bool sp : {false, true}) {
    const parallel::TensorParallel tp = parallel::TensorParallel::create(ctx, world, sp);
    const int64_t rows = sp ? T / P : T, r0 = sp ? me * rows : 0;
    for (bool gather_output : {false, true}) {
      const std::string what = str_cat("column-parallel", sp ? " SP" : "", gather_output ? " gather_output" : "");
      std::vector<double> y, dx, dw, db;
      reference("col", y, dx, dw, db);
      ColumnParallelLinear layer(ctx, "col", in, out, true, DType::F64, tp, {.gather_output = gather_output});
      layer.init(ctx, 3, 0.5);
      fill_parameter_normal(ctx, layer.bias, 3, 77, 0.0, 0.5);
      const int64_t cols = gather_output ? out : out / P, c0 = gather_output ? 0 : me * cols;
      Tensor yt = ctx.empty({T, cols}, DType::F64), dxt = ctx.empty({rows, in}, DType::F64);
      LinearSaved saved = layer.forward(ctx, yt, tensor_of(block(xv, in, r0, rows, 0, in), {rows, in}));
      layer.backward(ctx, std::move(saved), dxt, tensor_of(block(dyv, out, 0, T, c0, cols), {T, cols}));
      expect_close(testing::to_doubles(ctx, yt), block(y, out, 0, T, c0, cols), what + " output");
      expect_close(testing::to_doubles(ctx, dxt), block(dx, in, r0, rows, 0, in), what + " input gradient");
      expect_close(testing::to_doubles(ctx, layer.weight.main_grad), piece(layer.weight, dw), what + " weight gradient");
      expect_close(testing::to_doubles(ctx, layer.bias.main_grad), piece(layer.bias, db), what + " bias gradient");
    }
    for (bool input_is_parallel : {true, false}) {
      const std::string what = str_cat("row-parallel", sp ? " SP" : "", input_is_parallel ? "" : " whole input");
      std::vector<double> y, dx, dw, db;
      reference("row", y, dx, dw, db);
      RowParallelLinear layer(ctx, "row", in, out, true, DType::F64, tp, {.input_is_parallel = input_is_parallel});
      layer.init(ctx, 3, 0.5);
      fill_parameter_normal(ctx, layer.bias, 3, 77, 0.0, 0.5);
      const int64_t cols = input_is_parallel ? in / P : in, c0 = input_is_parallel ? me * cols : 0;
      Tensor yt = ctx.empty({rows, out}, DType::F64), dxt = ctx.empty({T, cols}, DType::F64);
      LinearSaved saved = layer.forward(ctx, yt, tensor_of(block(xv, in, 0, T, c0, cols), {T, cols}));
      layer.backward(ctx, std::move(saved), dxt, tensor_of(block(dyv, out, r0, rows, 0, out), {rows, out}));
      expect_close(testing::to_doubles(ctx, yt), block(y, out, r0, rows, 0, out), what + " output");
      expect_close(testing::to_doubles(ctx, dxt), block(dx, in, 0, T, c0, cols), what + " input gradient");
      expect_close(testing::to_doubles(ctx, layer.weight.main_grad), piece(layer.weight, dw), what + " weight gradient");
      expect_close(testing::to_doubles(ctx, layer.bias.main_grad), db, what + " bias gradient (replicated)");
    }
  }
}

TEST(TensorParallel, SameLossAndGradientsAsOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  Context& ctx = testing::cpu_context();
  struct Arch {
    const char* name;
    train::ModelArguments args;
  };
  const Arch archs[] = {{"gpt", gpt_args()}, {"gpt-mha", gpt_mha_args()}, {"llama", llama_args()}};
  for (int tp_size : {2, 4}) {
    std::shared_ptr<comm::Communicator> group = world->split(world->rank() / tp_size, world->rank() % tp_size, "tp");
    for (const Arch& arch : archs)
      for (double dropout : {0.0, 0.2}) {
        train::ModelArguments args = arch.args;
        args.hidden_dropout = dropout;
        // The TP=1 reference uses the vocabulary padded for TP = N (Megatron pads to 4 x TP here).
        const TransformerConfig config = train::transformer_config(args, DType::F32, 17, tp_size);
        ASSERT_EQ(config.padded_vocab_size % tp_size, 0);
        const Batch batch = make_batch(ctx, 2, args.seq_length, args.vocab_size);
        const uint64_t dropout_step = 5;
        const Reference ref = run_reference(config, batch, dropout_step);
        for (bool sp : {false, true}) {
          const std::string what = str_cat(arch.name, " TP=", tp_size, sp ? " SP" : "", " dropout ", dropout);
          SCOPED_TRACE(what);
          GPTModel model(ctx, config, parallel::TensorParallel::create(ctx, group, sp));
          randomize(ctx, model);
          const double loss =
              model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = dropout_step});
          sum_partial_grads_over_tp(ctx, model);  // the norms' partial gradients under SP
          expect_matches_reference(model, ref, loss, *group, what);
          // Eval mode too: the same loss without dropout.
          GPTModel ref_model(ctx, config);
          randomize(ctx, ref_model);
          const double eval = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
          const double ref_eval = ref_model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
          EXPECT_LE(std::fabs(eval - ref_eval), 1e-5 * std::fabs(ref_eval)) << what << " (eval)";
        }
      }
  }
}

// Dropout is drawn by whole-tensor element index: changing the TP layout must not change the masks, but a
// different micro-batch (dropout_step) must. Guards against a test that passes because dropout is inactive.
TEST(TensorParallel, DropoutMasksFollowTheElementNotTheLayout) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  train::ModelArguments args = llama_args();
  args.hidden_dropout = 0.3;
  const TransformerConfig config = train::transformer_config(args, DType::F32, 17, 4);
  const Batch batch = make_batch(ctx, 2, args.seq_length, args.vocab_size);
  GPTModel model(ctx, config, parallel::TensorParallel::create(ctx, world, /*sequence_parallel=*/true));
  randomize(ctx, model);
  const double a = model.forward_loss(ctx, batch.tokens, batch.labels, batch.mask);
  const double b = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = 1});
  const double c = model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask, {.dropout_step = 2});
  EXPECT_GT(std::fabs(a - b), 1e-4) << "dropout is not active";
  EXPECT_GT(std::fabs(b - c), 1e-4) << "two micro-batches drew the same masks";
}

// Sequence parallelism shards what the layers save for backward (norm inputs, the residual stream, the
// column-parallel layers' inputs): the peak memory of a forward-backward above the model state must drop.
TEST(TensorParallel, SequenceParallelShrinksActivationMemory) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  train::ModelArguments args = llama_args();
  args.num_layers = 4;
  args.hidden_size = 128;
  args.kv_channels = 16;
  args.ffn_hidden_size = 128;
  args.seq_length = 64;
  const TransformerConfig config = train::transformer_config(args, DType::F32, 17, world->size());
  const Batch batch = make_batch(ctx, 4, args.seq_length, args.vocab_size);
  double peak[2] = {0, 0};
  for (bool sp : {false, true}) {
    GPTModel model(ctx, config, parallel::TensorParallel::create(ctx, world, sp));
    const size_t state = ctx.allocator().stats().allocated_bytes;
    ctx.allocator().reset_peak_stats();
    model.forward_backward(ctx, batch.tokens, batch.labels, batch.mask);
    peak[sp] = double(ctx.allocator().stats().peak_allocated_bytes - state);
  }
  std::cout << "TP=" << world->size() << " activation peak: " << peak[0] / 1e6 << " MB without SP, " << peak[1] / 1e6
            << " MB with SP\n";
  EXPECT_LT(peak[1], 0.6 * peak[0]);
}

TEST(TensorParallel, ConfigurationsThatDoNotSplitAreRefusedWithEveryReason) {
  auto world = testing::mpi_world();
  Context& ctx = testing::cpu_context();
  train::ModelArguments args = gpt_args();
  args.num_attention_heads = 6;
  args.num_query_groups = 3;
  args.ffn_hidden_size = 30;
  const TransformerConfig config = train::transformer_config(args, DType::F32, 1);  // padded for TP = 1: 40, not a multiple of 16
  testing::expect_error(
      [&] { GPTModel m(ctx, config, parallel::TensorParallel::create(ctx, world, false)); },
      {"split over 4 tensor-parallel ranks", "--num-attention-heads 6", "--num-query-groups 3", "--ffn-hidden-size 30"});
  testing::expect_error([&] { train::transformer_config(args, DType::F32, 1, 4); },
                        {"--num-attention-heads 6", "divisible by --tensor-model-parallel-size 4"});
}

#if MEGATRON_WITH_NCCL
TEST(TensorParallelGpu, GpusMatchOneInBf16) {
  auto world = testing::mpi_world();
  const int count = cuda_device_count();
  if (count == 0 || world->size() < 2 || testing::mpi_runtime().local_size() > count)
    GTEST_SKIP() << "needs 2 or more ranks with a GPU each";
  const int tp = world->size();  // TP over every rank (2, 4 or 8 GPUs)
  const Device device = Device::cuda(testing::mpi_runtime().local_rank() % count);
  auto gpu = Context::create(device);
  std::shared_ptr<comm::Communicator> nccl =
      comm::NcclCommunicator::create(*world, device.index, "tp", comm::timeout_from_minutes(2.0));
  Context& cpu = testing::cpu_context();
  for (const train::ModelArguments& base : {gpt_args(), gpt_mha_args(), llama_args()}) {
    train::ModelArguments args = base;
    args.hidden_size = 64;
    args.kv_channels = 8;  // the fused attention's head dimension multiple
    args.seq_length = 32;
    args.hidden_dropout = 0.1;
    const TransformerConfig config = train::transformer_config(args, DType::BF16, 17, tp);
    const Batch host = make_batch(cpu, 2, args.seq_length, args.vocab_size);
    Batch batch{to_device(*gpu, host.tokens, device, cpu.allocator()), to_device(*gpu, host.labels, device, cpu.allocator()),
                to_device(*gpu, host.mask, device, cpu.allocator())};
    GPTModel ref(*gpu, config);
    randomize(*gpu, ref);
    const double ref_loss = ref.forward_backward(*gpu, batch.tokens, batch.labels, batch.mask, {.dropout_step = 3});
    std::map<std::string, Parameter*> ref_params;
    for (Parameter* p : ref.parameters()) ref_params[p->name] = p;
    for (bool sp : {false, true}) {
      SCOPED_TRACE(str_cat("TP=", tp, sp ? " SP" : ""));
      GPTModel model(*gpu, config, parallel::TensorParallel::create(*gpu, nccl, sp));
      randomize(*gpu, model);
      const double loss = model.forward_backward(*gpu, batch.tokens, batch.labels, batch.mask, {.dropout_step = 3});
      sum_partial_grads_over_tp(*gpu, model);
      EXPECT_NEAR(loss, ref_loss, 2e-2 * std::fabs(ref_loss));
      for (Parameter* p : model.parameters()) {
        const ParameterShard shard = describe_shard(*p);
        const std::vector<double> grad = testing::to_doubles(*gpu, p->main_grad);
        const std::vector<double> want = testing::to_doubles(*gpu, ref_params.at(p->name)->main_grad);
        double diff2 = 0, ref2 = 0;
        for_each_element(shard, p->value.shape().dims(), [&](int64_t local, int64_t global) {
          const double d = grad[size_t(local)] - want[size_t(global)];
          diff2 += d * d;
          ref2 += want[size_t(global)] * want[size_t(global)];
        });
        EXPECT_LE(std::sqrt(diff2), 5e-2 * std::sqrt(ref2) + 1e-6) << p->name;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace megatron::nn
