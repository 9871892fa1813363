// The acceptance test of pipeline parallelism through the trainer, under `mpiexec -np 8` (CPU ranks, fp32):
// every layout trains 10 iterations (gradient accumulation, clipping active, hidden dropout on for the GPT
// style) and must give the losses, gradient norms and validation loss of one rank within 1e-5 relative:
//   PP=2 (tied GPT-2 style: the last stage's copy of the word embeddings summed over the embedding group),
//   PP=4, interleaved PP=2 x 2 chunks (at PP = 2 the previous and the next rank are the same one: the case
//   Megatron refuses without p2p overlap), interleaved PP=2 x 2 chunks without overlap, uneven first/last
//   stages, interleaved chunks of different sizes from --pipeline-model-parallel-layout, PP=2 x TP=2 + SP, PP=2 x DP=2 with the distributed optimizer (the shared embedding's own bucket),
//   and PP=2 x TP=2 x DP=2, for a GPT-style and a Llama-style model. Ranks outside a layout's world wait.
// The layouts compute the same function in another order (the gradient norm's squares summed per stage, the
// tied embeddings' two gradient halves added after the backward), so they differ from one rank by rounding;
// Adam turns rounding in near-zero gradient elements into full-size updates, so the learning rate (3e-3) is
// one at which that drift stays far below 1e-5 over the 10 steps (at 1e-2 the Llama-style norm drifts to 4e-5
// by step 8 while the losses still agree to 1e-7).
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4", "--num-query-groups", "2",
      "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters",
      std::to_string(kIterations), "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine",
      "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099",
      "--make-vocab-size-divisible-by", "16", "--attention-dropout", "0", "--seed", "9", "--eval-interval", "1000",
      "--eval-iters", "1"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing_layouts::layout_args(world_size, argv);
}

const std::vector<std::string> kGpt = {"--hidden-dropout", "0.1", "--ffn-hidden-size", "64"};
const std::vector<std::string> kLlama = {"--hidden-dropout", "0", "--normalization", "RMSNorm", "--swiglu",
                                        "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
                                        "--untie-embeddings-and-output-weights", "--disable-bias-linear"};

TEST(PipelineParallelTraining, EveryLayoutTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 8) << "run with mpiexec -np 8";
  const std::vector<Layout> layouts = {
      {"PP=2", 2, {.pipeline_model_parallel = 2}, {"--pipeline-model-parallel-size", "2"}},
      {"PP=4", 4, {.pipeline_model_parallel = 4}, {"--pipeline-model-parallel-size", "4"}},
      {"PP=2 interleaved x2", 2, {.pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"}},
      {"PP=2 interleaved x2, no p2p overlap", 2, {.pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
        "--no-overlap-p2p-communication"}},
      {"PP=4 uneven (first 1, last 3)", 4, {.pipeline_model_parallel = 4},
       {"--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "1",
        "--decoder-last-pipeline-num-layers", "3"}},
      {"PP=2 interleaved x2, custom layout (3, 2 | 2, 1 layers)", 2, {.pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*3|t*2|t*2|tL"}},
      {"PP=2 x TP=2 + SP", 4, {.tensor_model_parallel = 2, .pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"PP=2 x DP=2, distributed optimizer", 4, {.pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce"}},
      {"PP=2 x TP=2 x DP=2, distributed optimizer", 8, {.tensor_model_parallel = 2, .pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}},
  };
  expect_layouts_train_like_one_rank(*world, layouts, {{"gpt", kGpt}, {"llama", kLlama}}, make_args);
}

}  // namespace
}  // namespace megatron::trainer
