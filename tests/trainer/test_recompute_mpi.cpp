// Activation recomputation is invisible in the numbers, under `mpiexec -np 4` (CPU ranks, fp32): a GPT-style
// (bias, GELU, learned positions) and a Llama-style model, 6 layers, hidden dropout 0.1, train 10 iterations
// with each recomputation -- full uniform in units of 1 and of 2 layers (a shorter last unit on a pipeline
// stage of 3 layers), full block 2, selective mlp, layernorm, layernorm + mlp, and Megatron's default selective
// core_attn -- at one rank,
// TP=2 + SP, PP=2 and CP=2 (the ring attention's exchanges run again in the recomputed forwards), and every
// loss, gradient norm and the validation loss must be bit for bit the run without recomputation at the same
// layout: the recomputed forwards draw the same dropout masks and run the same collectives. One FP8 (delayed,
// hybrid) case holds the same with the iteration's scales, and MoE models with the experts' activation recomputed
// (moe_act) and with full recomputation at one rank, EP=2 and EP=4, the logged router losses included (a recomputed
// router must not count its tokens or losses twice).
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "6", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
      "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", std::to_string(kIterations), "--lr", "3e-3",
      "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "16",
      "--attention-dropout", "0", "--hidden-dropout", "0.1", "--seed", "17", "--eval-interval", "1000",
      "--eval-iters", "1", "--ffn-hidden-size", "64", "--init-method-std", "0.1"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return layout_args(world_size, argv);
}

const std::vector<std::string> kLlama = {"--group-query-attention", "--num-query-groups", "2", "--normalization",
                                         "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                                         "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
const std::vector<std::string> kGpt = {"--max-position-embeddings", "32"};

const Variants kRecomputations = {
    {"full uniform 1", {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
    {"full uniform 2", {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"}},
    {"full block 2", {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"}},
    {"selective mlp", {"--recompute-granularity", "selective", "--recompute-modules", "mlp"}},
    {"selective layernorm", {"--recompute-granularity", "selective", "--recompute-modules", "layernorm"}},
    {"selective layernorm + mlp", {"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mlp"}},
    {"selective core_attn (--recompute-activations)", {"--recompute-activations"}},
};

TEST(Recompute, EveryRecomputationIsBitwiseInvisibleAtEveryLayout) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const std::vector<Layout> layouts = {
      {"one rank", 1, {}, {}},
      {"TP=2 + SP", 2, {.tensor_model_parallel = 2},
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "8"}},
      {"PP=2", 2, {.pipeline_model_parallel = 2}, {"--pipeline-model-parallel-size", "2"}},
      {"CP=2", 2, {.context_parallel = 2}, {"--context-parallel-size", "2"}},
  };
  expect_variants_identical(*world, layouts, {{"gpt", kGpt}, {"llama", kLlama}}, make_args, kRecomputations);
}

// --distribute-saved-activations: full recomputation's kept unit inputs split over TP (no sequence parallelism)
// and all-gathered before the recomputation, GPT- and Llama-style at TP=2: bitwise the run without recomputation.
TEST(Recompute, DistributedSavedActivationsAreBitwiseInvisible) {
  auto world = testing::mpi_world();
  const Layout tp2{"TP=2", 2, {.tensor_model_parallel = 2},
                   {"--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "8"}};
  expect_variants_identical(
      *world, {tp2}, {{"gpt", kGpt}, {"llama", kLlama}}, make_args,
      {{"full uniform 1, distributed saved activations", {"--recompute-granularity", "full", "--recompute-method",
                                                          "uniform", "--recompute-num-layers", "1",
                                                          "--distribute-saved-activations"}},
       {"full block 2, distributed saved activations", {"--recompute-granularity", "full", "--recompute-method", "block",
                                                        "--recompute-num-layers", "2", "--distribute-saved-activations"}}});
}

// The routed experts' activation recomputed (moe_act), alone and with the norms, and full recomputation (the router's
// forward again: its metrics and the expert bias's counts must not take the tokens twice): a Llama-style MoE (4
// experts, top 2, a shared expert, every other layer MoE) with the switch aux loss, and one with sigmoid routing, the
// expert bias, the sequence-level aux loss and the z-loss, at one rank and at EP=2 and EP=4 (all-to-all dispatcher).
TEST(Recompute, MoeRecomputationIsBitwiseInvisible) {
  auto world = testing::mpi_world();
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24",
                                        "--moe-layer-freq", "([0]+[1])*3", "--moe-shared-expert-intermediate-size", "16",
                                        "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.1",
                                        "--moe-token-dispatcher-type", "alltoall"};
  std::vector<std::string> arch = kLlama;
  arch.insert(arch.end(), moe.begin(), moe.end());
  std::vector<std::string> biased = arch;
  biased.insert(biased.end(), {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                               "--moe-router-bias-update-rate", "0.01", "--moe-router-load-balancing-type",
                               "seq_aux_loss", "--moe-z-loss-coeff", "1e-3"});
  const std::vector<Layout> layouts = {
      {"one rank", 1, {}, {}},
      {"EP=2", 2, {.expert_model_parallel = 2}, {"--expert-model-parallel-size", "2"}},
      {"EP=4", 4, {.expert_model_parallel = 4}, {"--expert-model-parallel-size", "4"}},
  };
  expect_variants_identical(*world, layouts, {{"moe", arch}}, make_args,
                            {{"selective moe_act", {"--recompute-granularity", "selective", "--recompute-modules", "moe_act"}},
                             {"selective moe_act + layernorm", {"--recompute-granularity", "selective",
                                                                "--recompute-modules", "moe_act", "layernorm"}},
                             {"selective moe", {"--recompute-granularity", "selective", "--recompute-modules", "moe"}},
                             {"selective shared_experts", {"--recompute-granularity", "selective", "--recompute-modules",
                                                           "shared_experts"}},
                             {"full uniform 1", {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                 "--recompute-num-layers", "1"}}});
  expect_variants_identical(*world, layouts, {{"moe, sigmoid with expert bias, seq aux and z-loss", biased}}, make_args,
                            {{"selective moe + layernorm", {"--recompute-granularity", "selective",
                                                            "--recompute-modules", "moe", "layernorm"}},
                             {"full block 2", {"--recompute-granularity", "full", "--recompute-method", "block",
                                               "--recompute-num-layers", "2"}}});
}

TEST(Recompute, FullRecomputationInFp8IsBitwiseInvisible) {
  auto world = testing::mpi_world();
  if (world->rank() != 0) return;
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "2"};
  std::vector<std::string> recompute = fp8;
  recompute.insert(recompute.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                     "--recompute-num-layers", "2"});
  const TrainingData data(make_args(1, kLlama, fp8), 4098);
  const parallel::ParallelContext pc = parallel::ParallelContext::single();
  expect_identical_training(train_layout(make_args(1, kLlama, recompute), pc, data),
                            train_layout(make_args(1, kLlama, fp8), pc, data));
}

}  // namespace
}  // namespace megatron::trainer
