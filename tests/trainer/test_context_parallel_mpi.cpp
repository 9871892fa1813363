// The acceptance test of context parallelism through the trainer, under `mpiexec -np 8` (CPU ranks, fp32):
// every layout trains 10 iterations (gradient accumulation, clipping active, hidden and attention dropout on
// for the GPT style) and must give the losses, gradient norms and validation loss of one rank within 1e-5 relative:
//   CP = 2 and CP = 4 with p2p (the ring), a2a and all_gather (Megatron's spelling allgather), a2a+p2p with
//   hierarchical sizes 2 x 2, one type per layer, CP = 2 x TP = 2 + SP, CP = 2 x DP = 2 with the distributed
//   optimizer (sharded over DP x CP) and overlapped gradient reduction, CP = 2 x PP = 2 and
//   CP = 2 x TP = 2 x DP = 2, for a GPT-style model (MHA, learned positions, dropout) and a Llama-style one
//   (GQA, RoPE). Ranks outside a layout's world wait.
// What this pins down beyond the attention: the split of tokens, labels and positions, dropout masks drawn
// at the tokens' original positions (attention dropout's at the query's and key's positions and the head's
// index in every communication type), and the loss and gradient scaling over CP (each rank's loss is the mean
// over its tokens and the gradients are averaged over DP x CP: a loss multiplied by CP, or gradients divided
// by DP only, would move the gradient norm by a factor of CP).
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "4", "--hidden-size", "32", "--seq-length", "16", "--micro-batch-size", "1",
      "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr", "3e-3", "--min-lr", "3e-4",
      "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "0.5",
      "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "16",
      "--seed", "11", "--eval-interval", "1000", "--eval-iters", "1"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing_layouts::layout_args(world_size, argv);
}

const std::vector<std::string> kGpt = {"--num-attention-heads", "4", "--hidden-dropout", "0.1", "--attention-dropout",
                                      "0.1", "--ffn-hidden-size", "64"};
const std::vector<std::string> kLlama = {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups",
                                        "4", "--hidden-dropout", "0", "--attention-dropout", "0", "--normalization", "RMSNorm", "--swiglu",
                                        "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
                                        "--untie-embeddings-and-output-weights", "--disable-bias-linear"};

std::vector<Layout> layouts() {
  const parallel::ParallelSizes cp2{.context_parallel = 2}, cp4{.context_parallel = 4};
  const std::vector<std::string> f2 = {"--context-parallel-size", "2"}, f4 = {"--context-parallel-size", "4"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  return {
      {"CP=2 p2p", 2, cp2, f2},
      {"CP=2 a2a", 2, cp2, with(f2, {"--cp-comm-type", "a2a"})},
      {"CP=2 allgather", 2, cp2, with(f2, {"--cp-comm-type", "allgather"})},
      {"CP=4 p2p", 4, cp4, f4},
      {"CP=4 a2a", 4, cp4, with(f4, {"--cp-comm-type", "a2a"})},
      {"CP=4 all_gather", 4, cp4, with(f4, {"--cp-comm-type", "all_gather"})},
      {"CP=4 a2a+p2p (2 x 2)", 4, {.context_parallel = 4, .hierarchical_context_parallel = {2, 2}},
       with(f4, {"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"})},
      {"CP=2 p2p, deterministic mode", 2, cp2, with(f2, {"--deterministic-mode"})},
      {"CP=2 one type per layer", 2, cp2, with(f2, {"--cp-comm-type", "p2p", "a2a", "all_gather", "p2p"})},
      {"CP=2 x TP=2 + SP", 4, {.tensor_model_parallel = 2, .context_parallel = 2},
       with(f2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"})},
      {"CP=2 x DP=2, distributed optimizer", 4, cp2,
       with(f2, {"--use-distributed-optimizer", "--overlap-grad-reduce"})},
      {"CP=2 x PP=2", 4, {.pipeline_model_parallel = 2, .context_parallel = 2},
       with(f2, {"--pipeline-model-parallel-size", "2"})},
      {"CP=2 x TP=2 x DP=2, distributed optimizer", 8, {.tensor_model_parallel = 2, .context_parallel = 2},
       with(f2, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"})},
  };
}

TEST(ContextParallelTraining, EveryLayoutTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 8) << "run with mpiexec -np 8";
  std::vector<std::string> qwen3 = kLlama;  // the q/k norms run before RoPE, on each rank's own tokens
  qwen3.push_back("--qk-layernorm");
  expect_layouts_train_like_one_rank(*world, layouts(), {{"gpt", kGpt}, {"llama", kLlama}, {"qwen3", qwen3}},
                                     make_args);
}

}  // namespace
}  // namespace megatron::trainer
