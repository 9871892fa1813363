// Documents through the trainer, under `mpiexec -np 4` (CPU ranks, fp32), on a small indexed dataset of short
// documents (3 to 12 tokens, each ending with the EOD token), so that every sample of 16 tokens holds several:
//   - --calculate-per-token-loss with --eod-mask-loss (Llama-style, no dropout): the global batch of 8 samples as one micro-batch on one
//     rank, as 4 micro-batches of 2 on one rank, and as DP = 2 with 4 micro-batches of 1 each (micro-batches
//     with different counted tokens: asserted) give the same losses and gradient norms within 1e-6 relative
//     over the iterations; without the flag the micro-batches' means weigh their tokens unequally and the
//     gradient norm moves (what makes this test able to fail);
//   - packed documents (--reset-position-ids --reset-attention-mask --eod-mask-loss) at CP = 2 (every
//     --cp-comm-type runs the document-masked all-gather form) and at DP = 2 equal one rank within 1e-5 over
//     10 iterations, for a GPT-style (learned positions, dropout) and a Llama-style (RoPE, GQA) model;
//   - hybrid context parallelism (--hybrid-context-parallel) at CP = 2, CP = 4, CP = 2 x DP = 2 and TP = 2 + SP x
//     CP = 2, with budgets
//     of 3, 4 and 6 tokens a rank, so that the micro-batches run on 1, 2 and 4 CP ranks side by side (asserted on
//     the plan of the data's first micro-batches), equals one rank within 1e-5 over 10 iterations.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "layout_training.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/parallel/dynamic_cp_schedule.h"
#include "mpi_world.h"

namespace megatron::trainer {
namespace {

using namespace testing_layouts;

constexpr int64_t kVocab = 4099, kEod = kVocab - 1;

// Short documents of ids in [0, kEod), each closed by the EOD token; the same bytes on every rank.
std::string write_documents(const std::filesystem::path& dir) {
  const std::string prefix = (dir / "documents").string();
  data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
  for (int d = 0; d < 400; ++d) {
    std::vector<int32_t> tokens;
    const int length = 3 + (d * 7) % 10;
    for (int i = 0; i < length - 1; ++i) tokens.push_back((d * 131 + i * 17) % int(kEod));
    tokens.push_back(int32_t(kEod));
    writer.add_document(std::span<const int32_t>(tokens));
  }
  writer.finalize();
  return prefix;
}

const std::string& dataset_prefix() {
  static const std::string prefix = write_documents(testing::make_temp_dir("documents_mpi"));
  return prefix;
}

train::Arguments make_args(int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "--num-layers", "2", "--hidden-size", "32", "--seq-length", "16", "--micro-batch-size", "1",
      "--global-batch-size", "8", "--train-iters", std::to_string(kIterations), "--lr", "3e-3", "--min-lr", "3e-4",
      "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "0.5",
      "--data-path", dataset_prefix(), "--split", "90,10,0", "--vocab-size", std::to_string(kVocab),
      "--make-vocab-size-divisible-by", "16", "--attention-dropout", "0", "--seed", "11", "--eval-interval", "1000",
      "--eval-iters", "1", "--data-cache-path",
      (std::filesystem::path(dataset_prefix()).parent_path() / "cache").string()};
  argv.insert(argv.end(), arch.begin(), arch.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return layout_args(world_size, argv);
}

const std::vector<std::string> kGpt = {"--num-attention-heads", "4", "--hidden-dropout", "0.1", "--ffn-hidden-size", "64"};
const std::vector<std::string> kLlama = {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups",
                                        "4", "--hidden-dropout", "0", "--normalization", "RMSNorm", "--swiglu",
                                        "--ffn-hidden-size", "48", "--position-embedding-type", "rope",
                                        "--untie-embeddings-and-output-weights", "--disable-bias-linear"};

// One training run's figures on the first `ranks` ranks (the others wait): DP over them.
std::optional<TrainedRun> run_on(comm::Communicator& world, int ranks, const std::vector<std::string>& flags) {
  std::optional<TrainedRun> run;
  const std::shared_ptr<comm::Communicator> sub = world.split(world.rank() < ranks ? 0 : -1, world.rank(), "documents");
  if (sub) {
    const train::Arguments a = make_args(ranks, kLlama, flags);  // no dropout: the masks follow the micro-batch
    const TrainingData data(a, kEod);
    run = train_layout(a, parallel::ParallelContext::create(sub, {}), data);
  }
  world.barrier();
  return run;
}

void expect_within(const TrainedRun& got, const TrainedRun& want, double tol, const std::string& what) {
  for (int it = 0; it < kIterations; ++it) {
    expect_rel(got.losses[size_t(it)], want.losses[size_t(it)], tol, str_cat(what, ": loss of iteration ", it + 1));
    expect_rel(got.grad_norms[size_t(it)], want.grad_norms[size_t(it)], tol, str_cat(what, ": grad norm of iteration ", it + 1));
  }
  expect_rel(got.valid_loss, want.valid_loss, tol, str_cat(what, ": validation loss"));
}

TEST(Documents, MicroBatchesHaveDifferentTokenCounts) {
  const train::Arguments a = make_args(1, kGpt, {"--eod-mask-loss"});
  const TrainingData data(a, kEod);
  SampleStream stream = data.stream(data::Split::train);
  CpuAllocator host;
  std::vector<double> counts;
  for (int m = 0; m < 4; ++m)
    counts.push_back(make_host_micro_batch(stream.next(2, host), kEod, {.eod_mask_loss = true}, {1, 0, 16}, host).loss_tokens);
  EXPECT_TRUE(std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) != counts.end())
      << "the first four micro-batches of 2 samples must count different numbers of tokens";
}

TEST(Documents, PerTokenLossEqualsTheSingleBatchLoss) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const std::vector<std::string> per_token = {"--eod-mask-loss", "--calculate-per-token-loss"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto single = run_on(*world, 1, with(per_token, {"--micro-batch-size", "8"}));
  const auto micro = run_on(*world, 1, with(per_token, {"--micro-batch-size", "2"}));
  const auto dp2 = run_on(*world, 2, per_token);
  const auto single_mean = run_on(*world, 1, {"--eod-mask-loss", "--micro-batch-size", "8"});
  const auto dp2_mean = run_on(*world, 2, {"--eod-mask-loss"});
  if (world->rank() == 0) {
    expect_within(*micro, *single, 1e-6, "4 micro-batches of 2");
    expect_within(*dp2, *single, 1e-6, "DP = 2 x 4 micro-batches of 1");
    // Megatron's default: each micro-batch's mean, so tokens of small micro-batches weigh more.
    EXPECT_GT(std::fabs(dp2_mean->grad_norms[0] - single_mean->grad_norms[0]), 1e-4 * single_mean->grad_norms[0]);
    // The reported loss is the token-weighted mean either way (Megatron's report).
    expect_rel(dp2_mean->losses[0], single_mean->losses[0], 1e-6, "first reported loss without the flag");
  }
}

TEST(Documents, PackedDocumentsTrainLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  const parallel::ParallelSizes cp2{.context_parallel = 2};
  // Every run (the one-rank reference too) with the given document flags.
  auto with_flags = [](std::vector<std::string> flags) {
    return [flags](int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
      std::vector<std::string> all = flags;
      all.insert(all.end(), extra.begin(), extra.end());
      return make_args(world_size, arch, all);
    };
  };
  const std::vector<Layout> packed = {
      {"CP=2 (p2p)", 2, cp2, {"--context-parallel-size", "2"}},
      {"CP=2 a2a", 2, cp2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
      {"DP=2", 2, {}, {}},
  };
  expect_layouts_train_like_one_rank(*world, packed, {{"gpt", kGpt}, {"llama", kLlama}},
                                     with_flags({"--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"}));
  expect_layouts_train_like_one_rank(*world, {{"CP=2, reset positions only", 2, cp2, {"--context-parallel-size", "2"}}},
                                     {{"llama", kLlama}}, with_flags({"--reset-position-ids"}));
}

// The CP sizes the hybrid plan gives the data's first 8 micro-batches (one sample each) at `budget` tokens a rank
// over `cp` ranks, and its number of waves.
std::pair<std::set<int>, size_t> hybrid_plan(int cp, int64_t budget) {
  const train::Arguments a = make_args(1, kLlama, {"--reset-attention-mask"});
  const TrainingData data(a, kEod);
  SampleStream stream = data.stream(data::Split::train);
  CpuAllocator host;
  std::vector<int64_t> longest;
  for (int m = 0; m < 8; ++m) {
    const HostMicroBatch mb = make_host_micro_batch(stream.next(1, host), kEod, {.reset_attention_mask = true},
                                                    {1, 0, 16}, host);
    longest.push_back(longest_document(mb.cu_seqlens));
  }
  const std::vector<parallel::CpWave> plan = parallel::plan_dynamic_cp(longest, budget, cp);
  std::set<int> sizes;
  for (const parallel::CpWave& w : plan)
    for (const parallel::CpRun& r : w.runs) sizes.insert(r.size);
  return {sizes, plan.size()};
}

TEST(Documents, HybridContextParallelTrainsLikeOneRank) {
  auto world = testing::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpiexec -np 4";
  // The plans mix sizes and run micro-batches side by side (fewer waves than micro-batches).
  for (const auto& [cp, budget] : {std::pair{2, int64_t(6)}, std::pair{4, int64_t(3)}, std::pair{4, int64_t(4)}}) {
    const auto [sizes, waves] = hybrid_plan(cp, budget);
    EXPECT_GE(sizes.size(), 2u) << "CP " << cp << ", " << budget << " tokens a rank: one CP size only";
    EXPECT_LT(waves, 8u) << "CP " << cp << ", " << budget << " tokens a rank";
  }
  auto with_flags = [](std::vector<std::string> flags) {
    return [flags](int world_size, const std::vector<std::string>& arch, const std::vector<std::string>& extra) {
      std::vector<std::string> all = flags;
      all.insert(all.end(), extra.begin(), extra.end());
      return make_args(world_size, arch, all);
    };
  };
  auto hybrid = [](int cp, const char* budget) {
    return std::vector<std::string>{"--context-parallel-size", std::to_string(cp), "--hybrid-context-parallel",
                                    "--max-seqlen-per-dp-cp-rank", budget};
  };
  const std::vector<Layout> layouts = {
      {"CP=2 hybrid, 6 tokens a rank", 2, {.context_parallel = 2}, hybrid(2, "6")},
      {"CP=4 hybrid, 3 tokens a rank", 4, {.context_parallel = 4}, hybrid(4, "3")},
      {"CP=4 hybrid, 4 tokens a rank", 4, {.context_parallel = 4}, hybrid(4, "4")},
      {"CP=2 x DP=2 hybrid, 4 tokens a rank", 4, {.context_parallel = 2}, hybrid(2, "4")},
      {"TP=2 + SP x CP=2 hybrid, 4 tokens a rank", 4, {.tensor_model_parallel = 2, .context_parallel = 2},
       [&] {
         std::vector<std::string> f = hybrid(2, "4");
         f.insert(f.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
         return f;
       }()},
  };
  expect_layouts_train_like_one_rank(*world, layouts, {{"gpt", kGpt}, {"llama", kLlama}},
                                     with_flags({"--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
                                                 "--calculate-per-token-loss"}));
}

}  // namespace
}  // namespace megatron::trainer
