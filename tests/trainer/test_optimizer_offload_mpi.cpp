// Optimizer CPU offload is invisible in the numbers, under `mpiexec -np 2` (CPU ranks, bf16 parameters with
// fp32 masters, and fp32): a Llama-style model trains 10 iterations at one rank (replicated optimizer) and at
// DP=2 with the distributed optimizer, with --optimizer-cpu-offload at fractions 1.0, 0.5 and 0.2, and every
// loss, gradient norm and the validation loss must equal the run without offload at the same layout. On CPU
// ranks the host update is the same CPU AdamW as the device one, so they are equal bit for bit (on a GPU the
// host update runs in double where the device's runs in fp32: the runs agree to ~1e-6, not bitwise).
// --overlap-cpu-optimizer-d2h-h2d copies a bucket's offloaded gradients to the host as soon as the bucket is reduced
// (during the backward, with --overlap-grad-reduce and small buckets); on CPU ranks the copy happens right there, so
// a gradient copied before it is final -- before its DP reduction, a norm's TP sum under sequence parallelism, the
// tied embedding's sum over the pipeline's ends, fp16's unscaling or the per-token division -- changes the numbers.
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& extra, bool tied_embeddings = false) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr", "3e-3",
      "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099", "--attention-dropout", "0", "--hidden-dropout", "0",
      "--seed", "5", "--eval-interval", "1000", "--eval-iters", "1", "--group-query-attention", "--num-query-groups",
      "2", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
      "--disable-bias-linear", "--make-vocab-size-divisible-by", "8"};
  if (!tied_embeddings) argv.push_back("--untie-embeddings-and-output-weights");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return layout_args(world_size, argv);
}

TEST(OptimizerOffload, EveryFractionTrainsBitwiseLikeNoOffload) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 2) << "run with mpiexec -np 2";
  for (const std::vector<std::string>& precision : {std::vector<std::string>{"--bf16"}, std::vector<std::string>{}})
    for (const auto& [name, ranks, layout] : {std::tuple<std::string, int, std::vector<std::string>>{"one rank", 1, {}},
                                             {"DP=2, distributed optimizer", 2, {"--use-distributed-optimizer"}}}) {
      const std::shared_ptr<comm::Communicator> sub = world->split(world->rank() < ranks ? 0 : -1, world->rank(), "layout");
      if (sub) {
        std::vector<std::string> base = layout;
        base.insert(base.end(), precision.begin(), precision.end());
        const train::Arguments plain_args = make_args(ranks, base);
        const TrainingData data(plain_args, 4098);
        const parallel::ParallelContext pc = parallel::ParallelContext::create(sub, {});
        const TrainedRun plain = train_layout(plain_args, pc, data);
        for (const char* fraction : {"1.0", "0.5", "0.2"}) {
          SCOPED_TRACE(str_cat(name, precision.empty() ? " fp32" : " bf16", ", offload fraction ", fraction));
          std::vector<std::string> f = base;
          f.insert(f.end(), {"--optimizer-cpu-offload", "--optimizer-offload-fraction", fraction});
          expect_identical_training(train_layout(make_args(ranks, f), pc, data), plain);
        }
      }
      world->barrier();
    }
}

TEST(OptimizerOffload, OverlappedTransfersCopyOnlyFinalGradients) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 2) << "run with mpiexec -np 2";
  struct Case {
    std::string name;
    int ranks;
    parallel::ParallelSizes sizes;
    std::vector<std::string> flags;
    bool tied = false;
  };
  // Small buckets with --overlap-grad-reduce: most of them are reduced, and announced, during the backward.
  const std::vector<std::string> buckets = {"--overlap-grad-reduce", "--ddp-bucket-size", "600"};
  const std::vector<Case> cases = {
      {"one rank, bf16", 1, {}, {"--bf16"}},
      {"one rank, fp16 (unscaled in place after the reductions)", 1, {}, {"--fp16", "--initial-loss-scale", "1024"}},
      {"DP=2, distributed optimizer", 2, {}, {"--bf16", "--use-distributed-optimizer"}},
      {"DP=2, replicated optimizer, per-token loss", 2, {}, {"--calculate-per-token-loss"}},
      {"TP=2 + SP (norms summed over TP afterwards)", 2, {.tensor_model_parallel = 2},
       {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"PP=2, tied embeddings (summed over the ends afterwards)", 2, {.pipeline_model_parallel = 2},
       {"--pipeline-model-parallel-size", "2"}, true},
  };
  for (const Case& c : cases) {
    const std::shared_ptr<comm::Communicator> sub = world->split(world->rank() < c.ranks ? 0 : -1, world->rank(), "layout");
    if (sub) {
      std::vector<std::string> base = c.flags;
      base.insert(base.end(), buckets.begin(), buckets.end());
      const train::Arguments plain_args = make_args(c.ranks, base, c.tied);
      const TrainingData data(plain_args, 4098);
      const parallel::ParallelContext pc = parallel::ParallelContext::create(sub, c.sizes);
      const TrainedRun plain = train_layout(plain_args, pc, data);
      for (const char* fraction : {"1.0", "0.5"}) {
        SCOPED_TRACE(str_cat(c.name, ", offload fraction ", fraction));
        std::vector<std::string> f = base;
        f.insert(f.end(), {"--optimizer-cpu-offload", "--optimizer-offload-fraction", fraction,
                           "--overlap-cpu-optimizer-d2h-h2d"});
        expect_identical_training(train_layout(make_args(c.ranks, f, c.tied), pc, data), plain);
      }
    }
    world->barrier();
  }
}

}  // namespace
}  // namespace megatron::trainer
