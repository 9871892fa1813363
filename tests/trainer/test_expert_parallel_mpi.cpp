// The acceptance test of expert parallelism through the trainer, under `mpiexec -np 8` (CPU ranks, fp32):
// a Llama-style model whose layers 1 and 3 are MoE layers (4 experts, top-2, a shared expert, the switch
// load-balancing loss and the z-loss on) trains 10 iterations in every layout, which must give the losses,
// gradient norms, logged router losses and validation loss of one rank within 1e-5 relative:
//   EP = 2 and EP = 4 with the allgather and the alltoall dispatchers (EP folded over DP), EP = 2 x TP = 2 + SP
//   with expert TP 1 (both dispatchers) and expert TP 2, EP = 2 x DP = 2 with the distributed optimizer and
//   overlapped reduction (expert gradients summed over expert-DP / DP), EP = 2 x PP = 2, EP = 2 x CP = 2 and
//   EP = 4 x TP = 2 (8 ranks), capacity dropping (both policies) at EP = 2 and 4, and the sequence-level
//   load-balancing loss under TP + SP and CP, and the aux-loss-free expert bias (updated once per step). The
//   router losses' gradients and values must not change with TP, CP, EP or PP. Sinkhorn routing (the z-loss
//   its only router loss) at EP = 2 and 4 and EP = 2 x DP = 2.
#include <gtest/gtest.h>

#include <algorithm>

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
      "--mock-data", "--vocab-size", "4099", "--make-vocab-size-divisible-by", "16", "--attention-dropout", "0",
      "--seed", "11", "--eval-interval", "1000", "--eval-iters", "1"};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing_layouts::layout_args(world_size, argv);
}

const std::vector<std::string> kMoe = {
    "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4", "--hidden-dropout", "0",
    "--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
    "--moe-ffn-hidden-size", "24", "--moe-layer-freq", "([0]+[1])*2", "--moe-shared-expert-intermediate-size", "16",
    "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01",
    "--init-method-std", "0.1"};

std::vector<Layout> layouts() {
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> ep2 = {"--expert-model-parallel-size", "2"}, ep4 = {"--expert-model-parallel-size", "4"};
  const std::vector<std::string> a2a = {"--moe-token-dispatcher-type", "alltoall"};
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  const parallel::ParallelSizes s_ep2{.expert_model_parallel = 2}, s_ep4{.expert_model_parallel = 4};
  const parallel::ParallelSizes s_ep2_tp2_etp1{.tensor_model_parallel = 2, .expert_model_parallel = 2,
                                               .expert_tensor_parallel = 1};
  const parallel::ParallelSizes s_ep2_tp2{.tensor_model_parallel = 2, .expert_model_parallel = 2};
  return {
      {"EP=2 allgather", 2, s_ep2, ep2},
      {"EP=2 alltoall", 2, s_ep2, with(ep2, a2a)},
      {"EP=4 allgather", 4, s_ep4, ep4},
      {"EP=4 alltoall", 4, s_ep4, with(ep4, a2a)},
      {"EP=2 x TP=2 + SP, expert TP 1, allgather", 4, s_ep2_tp2_etp1,
       with(with(ep2, tp2), {"--expert-tensor-parallel-size", "1"})},
      {"EP=2 x TP=2 + SP, expert TP 1, alltoall", 4, s_ep2_tp2_etp1,
       with(with(with(ep2, tp2), {"--expert-tensor-parallel-size", "1"}), a2a)},
      {"EP=2 x TP=2 + SP, expert TP 2", 4, s_ep2_tp2, with(ep2, tp2)},
      {"EP=2 x TP=2 + SP, expert TP 2, alltoall", 4, s_ep2_tp2, with(with(ep2, tp2), a2a)},
      {"EP=2 x DP=2, distributed optimizer", 4, s_ep2, with(ep2, {"--use-distributed-optimizer", "--overlap-grad-reduce"})},
      {"EP=2 x PP=2", 4, {.pipeline_model_parallel = 2, .expert_model_parallel = 2},
       with(ep2, {"--pipeline-model-parallel-size", "2"})},
      {"EP=2 x CP=2", 4, {.context_parallel = 2, .expert_model_parallel = 2}, with(ep2, {"--context-parallel-size", "2"})},
      {"EP=4 x TP=2 + SP, expert TP 2, distributed optimizer", 8,
       {.tensor_model_parallel = 2, .expert_model_parallel = 4}, with(with(ep4, tp2), {"--use-distributed-optimizer"})},
      // Capacity: each router drops over ceil(T k / E x factor) of its own tokens, so the layouts that keep a
      // rank's tokens those of one micro-batch (EP over DP) compute the one-rank function.
      {"EP=2 allgather, capacity 0.75 (probs)", 2, s_ep2, ep2, {"--moe-expert-capacity-factor", "0.75"}},
      {"EP=4 alltoall, capacity 0.75 (position)", 4, s_ep4, with(ep4, a2a),
       {"--moe-expert-capacity-factor", "0.75", "--moe-token-drop-policy", "position"}},
      // The sequence-level loss with each sequence's rows split over the TP ranks (sequence parallelism) and
      // over CP: the per-sequence counts are summed over TP x CP.
      {"EP=2 x TP=2 + SP, expert TP 2, gated shared experts (Qwen2-MoE)", 4, s_ep2_tp2, with(ep2, tp2),
       {"--moe-shared-expert-gate"}},
      {"EP=2 x TP=2 + SP, seq_aux_loss", 4, s_ep2_tp2, with(ep2, tp2),
       {"--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.05"}},
      // Aux-loss-free balancing: the bias moves once per step from the selections of the whole global batch
      // (counts summed over TP x DP x CP), and only changes which experts are chosen.
      {"EP=2 x TP=2 + SP, sigmoid scores with the expert bias", 4, s_ep2_tp2, with(ep2, tp2),
       {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
        "0.05"}},
      {"EP=4 alltoall, sigmoid scores with the expert bias", 4, s_ep4, with(ep4, a2a),
       {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
        "0.05"}},
      {"EP=2 x CP=2, seq_aux_loss", 4, {.context_parallel = 2, .expert_model_parallel = 2},
       with(ep2, {"--context-parallel-size", "2"}),
       {"--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.05"}},
  };
}

TEST(ExpertParallelTraining, EveryLayoutTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 8) << "run with mpiexec -np 8";
  expect_layouts_train_like_one_rank(*world, layouts(), {{"moe", kMoe}}, make_args, /*min_moe_losses=*/2);
}

// Sinkhorn routing balances each router call's own tokens (Megatron's), so the layouts that keep a rank's tokens
// those of whole micro-batches (EP over DP) compute the one-rank function; under TP + SP or CP a rank balances a
// part of the sequence, a different function by design.
TEST(ExpertParallelTraining, SinkhornRoutingTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 8) << "run with mpiexec -np 8";
  std::vector<std::string> sinkhorn = kMoe;
  const auto type = std::find(sinkhorn.begin(), sinkhorn.end(), "aux_loss");
  ASSERT_NE(type, sinkhorn.end());
  *type = "sinkhorn";
  *std::next(std::find(sinkhorn.begin(), sinkhorn.end(), "--moe-aux-loss-coeff")) = "0";
  const std::vector<std::string> a2a = {"--moe-token-dispatcher-type", "alltoall"};
  const std::vector<Layout> sinkhorn_layouts = {
      {"EP=2 allgather", 2, {.expert_model_parallel = 2}, {"--expert-model-parallel-size", "2"}},
      {"EP=4 alltoall", 4, {.expert_model_parallel = 4}, {"--expert-model-parallel-size", "4", "--moe-token-dispatcher-type",
                                                          "alltoall"}},
      {"EP=2 x DP=2, distributed optimizer", 4, {.expert_model_parallel = 2},
       {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce"}},
  };
  expect_layouts_train_like_one_rank(*world, sinkhorn_layouts, {{"moe sinkhorn", sinkhorn}}, make_args,
                                     /*min_moe_losses=*/1);
}

}  // namespace
}  // namespace megatron::trainer
