// Megatron FSDP through the trainer, under `mpiexec -np 8` (CPU ranks, fp32): every sharding strategy
// (--data-parallel-sharding-strategy no_shard, optim, optim_grads, optim_grads_params) trains 10 iterations at
// DP = 2, DP = 4 (overlap flags on) and TP = 2 + SP x DP = 2, optim_grads_params also with PP = 2 x DP = 2,
// CP = 2 x DP = 2, with full recomputation, and with EP = 2 for a MoE model (FP8: test_trainer_fp8_mpi); each must give one rank's losses, gradient norms,
// router losses and validation loss within 1e-5 relative: the same step as DDP, whose equality with one rank test_trainer_data_parallel_mpi holds. The
// sharded strategies reduce every micro-batch's gradients unit by unit and gather the parameters around each
// use, so several micro-batches (gradient accumulation) and the tied embeddings' two uses (the embedding and
// the logits) are exercised. A second test holds what persists on a rank to its shards.
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
      "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr",
      "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "16",
      "--attention-dropout", "0", "--seed", "5", "--eval-interval", "1000", "--eval-iters", "1"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing_layouts::layout_args(world_size, argv);
}

// GPT-2 style: tied embeddings (the word embeddings are used by the embedding and by the logits), learned
// positions, biases, hidden dropout on.
const std::vector<std::string> kGpt = {"--hidden-dropout", "0.1", "--ffn-hidden-size", "64"};
const std::vector<std::string> kLlama = {"--hidden-dropout", "0", "--normalization", "RMSNorm", "--swiglu",
                                        "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
                                        "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                                        "--group-query-attention", "--num-query-groups", "2"};

std::vector<std::string> fsdp(const std::string& strategy, std::vector<std::string> more = {}) {
  std::vector<std::string> flags = {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

TEST(FsdpTraining, EveryShardingStrategyTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 8) << "run with mpiexec -np 8";
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  std::vector<Layout> layouts;
  for (const std::string strategy : {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    layouts.push_back({str_cat("FSDP ", strategy, " DP=2"), 2, {}, fsdp(strategy)});
    // no_shard keeps the replicated optimizer, which has no parameter gather to overlap.
    const std::vector<std::string> overlap = strategy == std::string("no_shard")
                                                 ? std::vector<std::string>{"--overlap-grad-reduce"}
                                                 : std::vector<std::string>{"--overlap-grad-reduce", "--overlap-param-gather"};
    layouts.push_back({str_cat("FSDP ", strategy, " DP=4, overlapped reduction (and gather)"), 4, {},
                       fsdp(strategy, overlap)});
    layouts.push_back({str_cat("FSDP ", strategy, " TP=2 + SP x DP=2"), 4, {.tensor_model_parallel = 2},
                       fsdp(strategy, tp2)});
  }
  layouts.push_back({"FSDP optim_grads_params PP=2 x DP=2", 4, {.pipeline_model_parallel = 2},
                     fsdp("optim_grads_params", {"--pipeline-model-parallel-size", "2"})});
  layouts.push_back({"FSDP optim_grads_params CP=2 x DP=2", 4, {.context_parallel = 2},
                     fsdp("optim_grads_params", {"--context-parallel-size", "2"})});
  layouts.push_back({"FSDP optim_grads_params DP=2, full recomputation", 2, {},
                     fsdp("optim_grads_params", {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                 "--recompute-num-layers", "2"})});
  expect_layouts_train_like_one_rank(*world, layouts, {{"gpt", kGpt}, {"llama", kLlama}}, make_args);
}

TEST(FsdpTraining, ExpertParallelMoeTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  const std::vector<std::string> moe = {
      "--hidden-dropout", "0", "--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size", "48",
      "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--moe-layer-freq", "([0]+[1])*2",
      "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.1", "--init-method-std", "0.1"};
  const std::vector<Layout> layouts = {
      {"FSDP optim_grads_params EP=2 x DP=2 (expert-DP 1)", 2, {.expert_model_parallel = 2},
       fsdp("optim_grads_params", {"--expert-model-parallel-size", "2"})},
      {"FSDP optim_grads EP=2 over DP=4 (expert-DP 2)", 4, {.expert_model_parallel = 2},
       fsdp("optim_grads", {"--expert-model-parallel-size", "2"})},
      {"FSDP optim_grads_params EP=2 over DP=4, alltoall", 4, {.expert_model_parallel = 2},
       fsdp("optim_grads_params", {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"})},
  };
  expect_layouts_train_like_one_rank(*world, layouts, {{"moe", moe}}, make_args, /*min_moe_losses=*/1);
}

// What persists per rank (fp32 on CPU ranks: 4-byte values and gradients, no master copy, 8 bytes of Adam
// moments per parameter) after a step, at DP = 4: optim keeps whole values and gradients (4 + 4 + 8/4 = 10 bytes
// per parameter), optim_grads only gradient shards (4 + 1 + 2 = 7), optim_grads_params value shards too
// (1 + 1 + 2 = 4), each up to the buckets' padding; and outside a forward or backward the Parameters of
// optim_grads_params hold no values at all (gathered only while their module group runs).
TEST(FsdpTraining, ShardedStrategiesKeepOnlyShards) {
  auto world = testing::mpi_world();
  const std::shared_ptr<comm::Communicator> sub = world->split(world->rank() < 4 ? 0 : -1, world->rank(), "dp4");
  if (sub) {
    Context& ctx = testing::cpu_context();
    for (const auto& [strategy, bytes_per_param] :
         std::vector<std::pair<std::string, double>>{{"optim", 10}, {"optim_grads", 7}, {"optim_grads_params", 4}}) {
      SCOPED_TRACE(strategy);
      const train::Arguments a = make_args(4, kLlama, fsdp(strategy));
      const parallel::ParallelContext pc = parallel::ParallelContext::create(sub, {});
      ctx.synchronize();
      const size_t before = ctx.allocator().stats().allocated_bytes;
      {
        const auto chunks = build_model_chunks(ctx, train::transformer_config(a, uint64_t(a.training.seed)),
                                               tensor_parallel(ctx, pc, a), context_parallel(pc, a), a, 0, moe_parallel(pc));
        const nn::ParameterList params = chunks.front()->parameters();
        const double elements = double(nn::count_elements(params));
        Trainer trainer(ctx, a, chunk_pointers(chunks), pc);
        const TrainingData data(a, a.model.vocab_size - 1);
        SampleStream stream = data.stream(data::Split::train);
        trainer.train_step(stream, 1);
        ctx.synchronize();
        const double persistent = double(ctx.allocator().stats().allocated_bytes - before);
        EXPECT_GE(persistent, 0.97 * bytes_per_param * elements) << "a rank's shards may hold more padding";
        EXPECT_LE(persistent, bytes_per_param * elements * 1.15) << "padding and small workspaces stay under 15%";
        const bool sharded_values = strategy == "optim_grads_params";
        for (const nn::Parameter* p : params) EXPECT_EQ(p->value.defined(), !sharded_values) << p->name;
        for (const nn::Parameter* p : params) EXPECT_EQ(p->main_grad.defined(), strategy == "optim") << p->name;
      }
    }
  }
  world->barrier();
}

}  // namespace
}  // namespace megatron::trainer
