// FP8 training through the trainer, under `mpiexec -np 4` (CPU ranks, the CPU's FP8 emulation): a
// Llama-style and a GPT-style model (bias, GELU) train 10 iterations in FP8 -- delayed scaling with the hybrid
// format, delayed scaling in E4M3 with a longer history, the max algorithm and a margin, and tensorwise
// (current) scaling -- and every layout must give the one-rank FP8 run's losses, gradient norms and validation
// loss within 1e-5 relative: pipelines of 2 and 4 stages in fp32 (each stage keeps and reduces its own scales;
// the run must not hang), and tensor and data parallelism (the distributed optimizer, FSDP; the weights kept in
// FP8 with --fp8-param-gather) in F64.
#include <gtest/gtest.h>

#include <algorithm>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

std::vector<std::string> base_argv() {
  return {
      "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
      "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr", "3e-3",
      "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "16",
      "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "13", "--eval-interval", "1000", "--eval-iters", "1",
      "--ffn-hidden-size", "64", "--init-method-std", "0.1"};
}

train::Arguments args_from(std::vector<std::string> argv, int world_size, const std::vector<std::string>& arch,
                           const std::vector<std::string>& extra) {
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing_layouts::layout_args(world_size, argv);
}

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  return args_from(base_argv(), world_size, arch, extra);
}

const std::vector<std::string> kLlama = {"--group-query-attention", "--num-query-groups", "2", "--normalization",
                                         "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                                         "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
const std::vector<std::string> kGpt = {"--max-position-embeddings", "32"};

const std::vector<std::vector<std::string>> kRecipes = {
    {"--fp8-format", "hybrid", "--fp8-recipe", "delayed"},
    {"--fp8-format", "e4m3", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max",
     "--fp8-margin", "1"},
    {"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"},
};

// The layouts whose forward is bit for bit one rank's (the micro-batches' activations are computed in the same
// order), so FP8 rounds the same numbers in fp32 too: pipeline stages.
std::vector<Layout> layouts() {
  return {
      {"PP=2", 2, {.pipeline_model_parallel = 2}, {"--pipeline-model-parallel-size", "2"}},
      {"PP=4", 4, {.pipeline_model_parallel = 4}, {"--pipeline-model-parallel-size", "4"}},
  };
}

// Each model with each recipe (the recipe is part of the function every layout must reproduce).
std::vector<Architecture> architectures() {
  std::vector<Architecture> out;
  for (const auto& [name, model] : {Architecture{"llama", kLlama}, Architecture{"gpt", kGpt}})
    for (const std::vector<std::string>& recipe : kRecipes) {
      std::vector<std::string> flags = model;
      flags.insert(flags.end(), recipe.begin(), recipe.end());
      out.push_back({str_cat(name, " ", recipe[1], " ", recipe[3], recipe.size() > 4 ? " (history 4, max, margin 1)" : ""),
                     flags});
    }
  return out;
}

TEST(Fp8Training, EveryLayoutTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  expect_layouts_train_like_one_rank(*world, layouts(), architectures(), make_args);
}

// The layouts that sum in another order: tensor parallelism (row-parallel partial products summed over TP,
// sequence-parallel norms) and data parallelism (gradient sums, the distributed optimizer's shards). In fp32
// their reordering noise moves single elements across FP8 rounding boundaries and the runs drift apart (~1e-3
// within a few iterations); with F64 parameters and activations (the CPU emulation: FP8 GEMMs accumulate into
// F64) the noise is ~1e-16, no element rounds differently, and every FP8 decision -- amaxes, scales, the
// quantised values -- is one rank's. So these hold the same 1e-5. Context parallelism is not among them: its
// attention merges blocks through fp32 log-sum-exp statistics even for F64 inputs, which is fp32 noise again.
std::vector<Layout> reordering_layouts() {
  return {
      {"TP=2 + SP", 2, {.tensor_model_parallel = 2}, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"DP=2, distributed optimizer, overlapped", 2, {}, {"--use-distributed-optimizer", "--overlap-grad-reduce"}},
      {"TP=2 + SP x DP=2, distributed optimizer", 4, {.tensor_model_parallel = 2},
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},
      // FSDP: the weights the FP8 linears cast are gathered anew around each use.
      {"DP=2, FSDP optim_grads_params", 2, {}, {"--use-megatron-fsdp"}},
  };
}

TEST(Fp8Training, TensorAndDataParallelTrainLikeOneRankInDouble) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  std::vector<Architecture> archs;
  for (const Architecture& a : architectures())
    if (a.first.find("history") == std::string::npos) archs.push_back(a);  // hybrid delayed and tensorwise
  expect_layouts_train_like_one_rank(*world, reordering_layouts(), archs, make_args, 0, DType::F64);
}

// --fp8-param-gather keeps the FP8 linears' weights only as FP8, quantised shard by shard from the distributed
// optimizer's masters and all-gathered as FP8 bytes. In F64 the masters are the values a run without the flag
// casts, and the amaxes the optimizer's casts record (delayed) or reduce over DP and TP (tensorwise) are the
// ones the forward's casts would, so each layout must train like one rank without the flag: this fails when a
// shard's amax is not reduced, a weight's scale_inv does not match its values, or the delayed history records
// the weights in the wrong iteration.
TEST(Fp8Training, Fp8ParamGatherTrainsLikeOneRankWithoutItInDouble) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const std::vector<std::string> gather = {"--use-distributed-optimizer", "--fp8-param-gather"};
  auto with_gather = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), gather.begin(), gather.end());
    return flags;
  };
  const std::vector<Layout> layouts = {
      {"one rank, FP8 weights", 1, {}, with_gather({})},
      {"DP=2, FP8 weights gathered, overlapped", 2, {},
       with_gather({"--overlap-grad-reduce", "--overlap-param-gather"})},
      {"TP=2 + SP x DP=2, FP8 weights gathered", 4, {.tensor_model_parallel = 2},
       with_gather({"--tensor-model-parallel-size", "2", "--sequence-parallel"})},
  };
  std::vector<Architecture> archs;
  for (const Architecture& a : architectures())
    if (a.first.find("history") == std::string::npos) archs.push_back(a);  // hybrid delayed and tensorwise
  expect_layouts_train_like_one_rank(*world, layouts, archs, make_args, 0, DType::F64);
}

// Blockwise scaling (1 x 128 / 128 x 128 block scales): blocks never cross a tensor-parallel shard, so a model
// whose shards are multiples of 128 wide (hidden 256 and ffn 512 over TP = 2: QKV, fc1's gate and up halves,
// and the row-parallel inputs all split on block boundaries) quantises under TP exactly as on one rank, and data
// parallelism and pipeline stages quantise each micro-batch as one rank does. In F64 (see above) every layout
// must then train like one rank. This fails when a shard's blocks are misplaced, when the transposes for the
// weight gradient reuse the forward's row blocks, or when a scale layout reaches the wrong GEMM operand.
train::Arguments make_blockwise_args(int world_size, const std::vector<std::string>& arch,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv = base_argv();
  auto set = [&](const std::string& flag, const std::string& value) {
    *(std::find(argv.begin(), argv.end(), flag) + 1) = value;
  };
  set("--num-layers", "2");
  set("--hidden-size", "256");
  set("--ffn-hidden-size", "512");
  // No clipping: the gradient norm is summed from fp32 per-rank norms (optim/grad_clip.h), so layouts clip with
  // coefficients ~1e-7 apart; over this model's ~10^6 quantised elements per iteration that moves one element
  // across an fp8 rounding boundary within ten iterations. Unclipped, the updates differ by F64 noise only.
  set("--clip-grad", "1e9");
  return args_from(argv, world_size, arch, extra);
}

TEST(Fp8Training, BlockwiseScalingTrainsLikeOneRankInDouble) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  std::vector<std::string> llama = kLlama;
  for (const char* f : {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}) llama.push_back(f);
  const std::vector<Layout> layouts = {
      {"TP=2 + SP", 2, {.tensor_model_parallel = 2}, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"DP=2, distributed optimizer", 2, {}, {"--use-distributed-optimizer"}},
      {"TP=2 + SP x DP=2, distributed optimizer", 4, {.tensor_model_parallel = 2},
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},
      {"PP=2", 2, {.pipeline_model_parallel = 2}, {"--pipeline-model-parallel-size", "2"}},
  };
  expect_layouts_train_like_one_rank(*world, layouts, {{"llama hybrid blockwise", llama}}, make_blockwise_args, 0,
                                     DType::F64);
}

}  // namespace
}  // namespace megatron::trainer
