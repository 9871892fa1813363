// --tp-comm-overlap changes when the tensor-parallel collectives run, not what is computed, under
// `mpiexec -np 4` (CPU ranks, fp32, MPI's nonblocking point-to-point under the rings): GPT-style (bias, GELU,
// learned positions, tied embeddings: the output layer is column-parallel too) and Llama-style models train 10
// iterations at TP=2 and TP=4 with sequence parallelism, with the overlap on, with each of its parts turned off
// in turn, and with --tp-comm-overlap-rs-dgrad, and every loss, gradient norm and the validation loss must
// equal the non-overlapped run at the same layout within 1e-6 (the pipelined reduce-scatters add the ranks'
// partial sums in another order).
#include <gtest/gtest.h>

#include <cmath>

#include "layout_training.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--seq-length", "32", "--micro-batch-size", "1",
      "--global-batch-size", "4", "--train-iters", std::to_string(kIterations), "--lr", "3e-3", "--min-lr", "3e-4",
      "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "0.5",
      "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "4", "--attention-dropout", "0",
      "--hidden-dropout", "0.1", "--seed", "23", "--eval-interval", "1000", "--eval-iters", "1", "--ffn-hidden-size",
      "64", "--init-method-std", "0.1", "--sequence-parallel"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return layout_args(world_size, argv);
}

const std::vector<std::string> kLlama = {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups",
                                         "4", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type",
                                         "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
const std::vector<std::string> kGpt = {"--num-attention-heads", "4", "--max-position-embeddings", "32"};

std::vector<std::pair<std::string, std::vector<std::string>>> variants() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out = {
      {"all parts", {"--tp-comm-overlap"}},
      {"all parts + rs-dgrad", {"--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad"}}};
  for (const char* part : {"overlap-ag", "overlap-rs", "bulk-dgrad", "bulk-wgrad", "split-ag", "split-rs"})
    out.push_back({str_cat("without ", part), {"--tp-comm-overlap", str_cat("--disable-tp-comm-", part)}});
  out.push_back({"without split-rs (--no- alias), with rs-dgrad",
                 {"--tp-comm-overlap", "--no-tp-comm-split-rs", "--tp-comm-overlap-rs-dgrad"}});
  return out;
}

void expect_close(const TrainedRun& got, const TrainedRun& want) {
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-6 * std::fabs(b); };
  for (int it = 0; it < kIterations; ++it) {
    EXPECT_PRED2(near, got.losses[size_t(it)], want.losses[size_t(it)]) << "loss of iteration " << it + 1;
    EXPECT_PRED2(near, got.grad_norms[size_t(it)], want.grad_norms[size_t(it)]) << "grad norm of iteration " << it + 1;
  }
  EXPECT_PRED2(near, got.valid_loss, want.valid_loss) << "validation loss";
}

TEST(TpCommOverlap, EveryPartTrainsLikeTheNonOverlappedRun) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  for (const auto& [arch_name, arch] : {Architecture{"gpt", kGpt}, Architecture{"llama", kLlama}}) {
    const TrainingData data(make_args(1, arch, {}), 4098);
    for (int tp : {2, 4}) {
      const std::shared_ptr<comm::Communicator> sub = world->split(world->rank() < tp ? 0 : -1, world->rank(), "layout");
      if (sub) {
        const parallel::ParallelContext pc = parallel::ParallelContext::create(sub, {.tensor_model_parallel = tp});
        const std::vector<std::string> layout = {"--tensor-model-parallel-size", std::to_string(tp)};
        const TrainedRun plain = train_layout(make_args(tp, arch, layout), pc, data);
        for (const auto& [name, flags] : variants()) {
          SCOPED_TRACE(str_cat(arch_name, ", TP=", tp, " + SP: ", name));
          std::vector<std::string> f = layout;
          f.insert(f.end(), flags.begin(), flags.end());
          expect_close(train_layout(make_args(tp, arch, f), pc, data), plain);
        }
      }
      world->barrier();
    }
  }
}

}  // namespace
}  // namespace megatron::trainer
