// Optimizer CPU offload is invisible in the numbers, under `mpiexec -np 2` (CPU ranks, bf16 parameters with
// fp32 masters, and fp32): a Llama-style model trains 10 iterations at one rank (replicated optimizer) and at
// DP=2 with the distributed optimizer, with --optimizer-cpu-offload at fractions 1.0, 0.5 and 0.2, and every
// loss, gradient norm and the validation loss must equal the run without offload at the same layout. On CPU
// ranks the host update is the same CPU AdamW as the device one, so they are equal bit for bit (on a GPU the
// host update runs in double where the device's runs in fp32: the runs agree to ~1e-6, not bitwise).
#include <gtest/gtest.h>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr", "3e-3",
      "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1",
      "--clip-grad", "0.5", "--mock-data", "--vocab-size", "4099", "--attention-dropout", "0", "--hidden-dropout", "0",
      "--seed", "5", "--eval-interval", "1000", "--eval-iters", "1", "--group-query-attention", "--num-query-groups",
      "2", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
      "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
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
          const TrainedRun run = train_layout(make_args(ranks, f), pc, data);
          for (int it = 0; it < kIterations; ++it) {
            EXPECT_EQ(run.losses[size_t(it)], plain.losses[size_t(it)]) << "loss of iteration " << it + 1;
            EXPECT_EQ(run.grad_norms[size_t(it)], plain.grad_norms[size_t(it)]) << "grad norm of iteration " << it + 1;
          }
          EXPECT_EQ(run.valid_loss, plain.valid_loss);
        }
      }
      world->barrier();
    }
}

}  // namespace
}  // namespace megatron::trainer
