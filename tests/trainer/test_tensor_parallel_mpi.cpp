// The acceptance test of tensor parallelism through the trainer, under `mpiexec -np 4`: TP=2 x DP=2 with the
// distributed optimizer (overlapped multi-bucket gradient reduction and parameter gathers; with and without
// sequence parallelism), TP=2 x DP=2 with the replicated optimizer and SP, and TP=4 with SP, each trained for a
// few iterations (fp32, clipping active, gradient accumulation), give the losses, gradient norms, validation
// loss and parameters of TP=1 x DP=1 within 1e-5 relative, for a GPT-style (biases, learned positions, tied,
// hidden and attention dropout on: each rank's heads draw TP=1's masks) and a Llama-style (RMSNorm, SwiGLU, RoPE, untied, no bias) model with GQA and a
// vocabulary (4099) not divisible by TP. The gradient norm is the check that replicated parameters (norms,
// row-parallel biases, position embeddings) are counted once and TP-sharded ones once per rank.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"
#include "megatron/nn/parameter_shard.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/trainer.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

constexpr int kIterations = 3;

train::Arguments make_args(int world_size, int tp, const std::vector<std::string>& arch,
                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "8", "--num-query-groups", "4",
      "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters",
      std::to_string(kIterations), "--lr", "1e-2", "--min-lr", "1e-3", "--lr-decay-style", "cosine",
      "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099",
      "--seed", "5", "--eval-interval", "1000", "--eval-iters", "1",
      "--tensor-model-parallel-size", std::to_string(tp)};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  train::Arguments a = train::parse_arguments(argv);
  a.parallel.world_size = world_size;
  train::resolve_and_validate(a);
  return a;
}

const std::vector<std::string> kGpt = {"--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--ffn-hidden-size", "64"};
const std::vector<std::string> kLlama = {"--hidden-dropout", "0", "--attention-dropout", "0", "--normalization",
                                        "RMSNorm", "--swiglu", "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
                                        "--untie-embeddings-and-output-weights", "--disable-bias-linear"};

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  double valid_loss = 0;
  std::vector<std::string> names;
  std::vector<nn::ParameterShard> shards;
  std::vector<std::vector<double>> params;  // local values
};

TrainedRun train(const train::Arguments& a, const parallel::ParallelContext& pc, const TrainingData& data) {
  Context& ctx = testing::cpu_context();
  const int tp = a.parallel.tensor_model_parallel_size;
  nn::GPTModel model(ctx, train::transformer_config(a.model, DType::F32, uint64_t(a.training.seed), tp),
                     parallel::TensorParallel::create(ctx, pc.tp().comm, a.parallel.sequence_parallel));
  SampleStream train_stream = data.stream(data::Split::train), valid_stream = data.stream(data::Split::valid);
  Trainer trainer(ctx, a, model, pc);
  TrainedRun run;
  for (int64_t it = 1; it <= kIterations; ++it) {
    StepResult r = trainer.train_step(train_stream, it);
    EXPECT_FALSE(r.skipped);
    run.losses.push_back(r.loss);
    run.grad_norms.push_back(r.grad_norm.value_or(NAN));
  }
  run.valid_loss = trainer.evaluate(valid_stream);
  for (nn::Parameter* p : model.parameters()) {
    run.names.push_back(p->name);
    run.shards.push_back(nn::describe_shard(*p));
    run.params.push_back(testing::to_doubles(ctx, p->value));
  }
  return run;
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want)) << what << ": " << got << " vs TP=1 " << want;
}

// This rank's piece of the whole parameter `whole` (row-major, shape shard.global_shape), in local order.
std::vector<double> piece_of(const std::vector<double>& whole, const nn::ParameterShard& shard, size_t local_numel) {
  std::vector<double> out(local_numel);
  const bool matrix = shard.global_shape.size() == 2;
  const int64_t global_cols = matrix ? shard.global_shape[1] : 1;
  int64_t local_cols = 0;
  for (const nn::ShardBox& b : shard.boxes) local_cols = shard.dim == 1 ? local_cols + b.shape[1] : (matrix ? b.shape[1] : 1);
  for (const nn::ShardBox& b : shard.boxes)
    for (int64_t r = 0; r < b.shape[0]; ++r)
      for (int64_t c = 0; c < (matrix ? b.shape[1] : 1); ++c) {
        const int64_t lr = (shard.dim == 0 ? b.local_offset : 0) + r, lc = (shard.dim == 1 ? b.local_offset : 0) + c;
        out[size_t(lr * local_cols + lc)] =
            whole[size_t((b.global_offset[0] + r) * global_cols + (matrix ? b.global_offset[1] : 0) + c)];
      }
  return out;
}

// The key-bias elements of a linear_qkv.bias piece (in local order). Their gradient is exactly zero in exact
// arithmetic (a bias shared by all keys shifts every score of a query equally, which softmax ignores), so what
// they receive is rounding noise (~1e-12, summed in another order by every layout), which Adam normalises into
// updates of the size of the learning rate: after a few steps they hold layout-dependent noise. Every other
// element of every parameter is compared.
std::vector<bool> key_bias_elements(const std::string& name, const nn::ParameterShard& shard,
                                    const train::ModelArguments& m) {
  std::vector<bool> out;
  for (const nn::ShardBox& b : shard.boxes)
    for (int64_t r = 0; r < b.shape[0]; ++r) {
      bool key = false;
      if (name.ends_with("self_attention.linear_qkv.bias")) {
        const int64_t d = m.kv_channels, per_group = (m.num_attention_heads / m.num_query_groups + 2) * d;
        const int64_t in_group = (b.global_offset[0] + r) % per_group;  // [queries | key | value] of one group
        key = in_group >= per_group - 2 * d && in_group < per_group - d;
      }
      out.push_back(key);
    }
  return out;
}

const TrainingData& shared_data() {
  static const train::Arguments args = make_args(1, 1, kLlama);
  static const TrainingData data(args, args.model.vocab_size - 1);
  return data;
}

TEST(TensorParallelTraining, SameLossesNormsAndParametersAsOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const TrainingData& data = shared_data();
  struct Arch {
    const char* name;
    std::vector<std::string> flags;
  };
  struct Variant {
    std::string name;
    int tp;
    std::vector<std::string> flags;
  };
  const std::vector<Variant> variants = {
      {"TP=2 x DP=2, distributed optimizer, overlapped buckets and gathers", 2,
       {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "4000", "--overlap-param-gather"}},
      {"TP=2 x DP=2 SP, distributed optimizer", 2, {"--sequence-parallel", "--use-distributed-optimizer"}},
      {"TP=2 x DP=2 SP, replicated optimizer", 2, {"--sequence-parallel", "--overlap-grad-reduce"}},
      {"TP=4 SP", 4, {"--sequence-parallel"}},
  };
  // Qwen3's per-head q/k norms: each TP rank normalises its own heads, so their gradients are partial sums.
  std::vector<std::string> qwen3 = kLlama;
  qwen3.push_back("--qk-layernorm");
  for (const Arch& arch : {Arch{"gpt", kGpt}, Arch{"llama", kLlama}, Arch{"qwen3", qwen3}}) {
    for (int tp : {2, 4}) {
      // The TP=1 reference pads the vocabulary as TP=tp does (Megatron pads to 128 x TP by default; 8 x TP here).
      std::vector<std::string> pad = {"--make-vocab-size-divisible-by", std::to_string(8 * tp)};
      std::vector<std::string> ref_flags = arch.flags;
      ref_flags.insert(ref_flags.end(), pad.begin(), pad.end());
      const TrainedRun reference = train(make_args(1, 1, ref_flags), parallel::ParallelContext::single(), data);
      // Clipping is active (the norm decides the update), and the steps change the loss.
      EXPECT_GT(reference.grad_norms.front(), 0.5);
      EXPECT_NE(reference.losses.back(), reference.losses.front());
      for (const Variant& v : variants) {
        if (v.tp != tp) continue;
        const std::string what = str_cat(arch.name, ": ", v.name);
        SCOPED_TRACE(what);
        const train::Arguments a = make_args(4, tp, arch.flags, [&] {
          std::vector<std::string> f = v.flags;
          f.insert(f.end(), {"--make-vocab-size-divisible-by", "8"});
          return f;
        }());
        ASSERT_EQ(a.padded_vocab_size(), make_args(1, 1, ref_flags).padded_vocab_size());
        const parallel::ParallelContext pc =
            parallel::ParallelContext::create(world, {.tensor_model_parallel = tp});
        ASSERT_EQ(pc.tp_size(), tp);
        TrainedRun run = train(a, pc, data);
        for (int it = 0; it < kIterations; ++it) {
          expect_rel(run.losses[size_t(it)], reference.losses[size_t(it)], 1e-5, str_cat("loss of iteration ", it + 1));
          expect_rel(run.grad_norms[size_t(it)], reference.grad_norms[size_t(it)], 1e-5,
                     str_cat("grad norm of iteration ", it + 1));
        }
        expect_rel(run.valid_loss, reference.valid_loss, 1e-5, "validation loss");
        ASSERT_EQ(run.names, reference.names);
        for (size_t i = 0; i < run.params.size(); ++i) {
          const std::vector<double> want = piece_of(reference.params[i], run.shards[i], run.params[i].size());
          const std::vector<bool> noise = key_bias_elements(run.names[i], run.shards[i], a.model);
          double diff = 0, norm = 0;
          for (size_t k = 0; k < want.size(); ++k) {
            if (noise[k]) continue;
            diff += (run.params[i][k] - want[k]) * (run.params[i][k] - want[k]);
            norm += want[k] * want[k];
          }
          // 1e-5 relative per tensor, as in the data-parallel test.
          EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm)) << run.names[i];
        }
      }
    }
  }
}

}  // namespace
}  // namespace megatron::trainer
