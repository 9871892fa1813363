// Resume bit-exactly: training stopped at iteration k, saved, and resumed in a fresh process state gives the
// same losses for iterations k+1..N, bit for bit, as the uninterrupted run (fp32 on the CPU; mock data and a
// real .bin/.idx dataset, hidden dropout on, so the data position and the RNG both matter). The same
// through the pretrain_gpt binary (--save/--exit-interval, then --load), comparing Megatron's log lines.
// Also two ranks through mpiexec (distributed optimizer, asynchronous saves), resumed at two ranks and
// loaded by one; and four ranks at TP=2 x DP=2 (SP, distributed optimizer), loaded by one process at TP=1
// (the same losses within 1e-5), whose checkpoint loads at TP=2 x DP=2 again. Also: --finetune loads weights
// only, --no-load-optim rebuilds the optimizer, and an architecture mismatch is refused with every difference
// listed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>

#include "harness.h"
#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/train/flags.h"
#include "megatron/train/fp8_arguments.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/trainer.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string write_dataset(const fs::path& dir) {
  std::string prefix = (dir / "corpus").string();
  data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
  for (int d = 0; d < 300; ++d) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 20 + (d * 7) % 31; ++i) tokens.push_back((d * 131 + i * 17) % 500);
    writer.add_document(std::span<const int32_t>(tokens));
  }
  writer.finalize();
  return prefix;
}

std::vector<std::string> base_flags(int64_t iters) {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", std::to_string(iters), "--lr", "3e-3",
          "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--eval-interval", "1000",
          "--eval-iters", "1", "--hidden-dropout", "0.2", "--attention-dropout", "0", "--seed", "11",
          "--weight-decay", "0.1"};
}

train::Arguments make_args(std::vector<std::string> flags) {
  train::Arguments a = train::parse_arguments(flags);
  a.parallel.world_size = 1;
  train::resolve_and_validate(a);
  return a;
}

// One "process": model, data and trainer built from the arguments, as pretrain_gpt builds them.
struct TrainingRun {
  std::unique_ptr<Context> ctx = Context::cpu();
  train::Arguments args;
  std::unique_ptr<nn::GPTModel> model;
  std::unique_ptr<trainer::TrainingData> data;
  trainer::SampleStream train, valid;
  std::unique_ptr<trainer::Trainer> trainer;
  int64_t iteration = 0;

  TrainingRun(train::Arguments a, DType dtype, uint64_t seed) : args(std::move(a)) {
    nn::TransformerConfig config = train::transformer_config(args.model, dtype, seed);
    config.moe = train::moe_config(args.moe, args.model);
    config.fp8 = train::fp8_recipe(args);
    model = std::make_unique<nn::GPTModel>(*ctx, config);
    data = std::make_unique<trainer::TrainingData>(args, args.model.vocab_size - 1);
    train = data->stream(data::Split::train);
    valid = data->stream(data::Split::valid);
    trainer = std::make_unique<trainer::Trainer>(*ctx, args, *model);
  }
  TrainingState state() {
    TrainingState s{.model = {model.get()}, .optimizer = &trainer->optimizer(),
                    .scheduler = &trainer->mutable_scheduler(), .scaler = trainer->mutable_loss_scaler(),
                    .args = &args, .iteration = iteration, .consumed_train_samples = train.consumed(),
                    .consumed_valid_samples = valid.consumed()};
    if (const optim::DistributedOptimizer* d = trainer->distributed_optimizer()) s.optimizer_ranges = d->param_ranges();
    return s;
  }
  std::vector<double> steps(int64_t until) {
    std::vector<double> losses;
    while (iteration < until) {
      ++iteration;
      losses.push_back(trainer->train_step(train, iteration).loss);
      if (iteration % 3 == 0) trainer->evaluate(valid);  // the validation position is saved too
    }
    return losses;
  }
  void load(const fs::path& root, const train::CheckpointArguments& flags) {
    CheckpointReader reader = CheckpointReader::open(root);
    TrainingState s = state();
    trainer->acquire_params_for_checkpoint();  // as pretrain_gpt's load does
    LoadedTraining l = load_training_checkpoint(*ctx, reader, s, flags);
    trainer->release_params_after_checkpoint(/*loaded=*/true);
    iteration = l.iteration;
    train.set_consumed(l.consumed_train_samples);
    valid.set_consumed(l.consumed_valid_samples);
  }
};

void expect_bit_exact_resume(const std::vector<std::string>& flags, DType dtype, bool async) {
  const int64_t N = 8, k = 4;
  train::Arguments args = make_args(flags);
  std::vector<double> full = TrainingRun(args, dtype, 11).steps(N);

  fs::path root = testing::make_temp_dir("resume");
  {
    TrainingRun first(args, dtype, 11);
    first.steps(k);
    train::CheckpointArguments cf;
    AsyncSaver saver;
    save_training_checkpoint(*first.ctx, root, first.state(), cf, async ? &saver : nullptr);
    if (async) first.steps(k + 1);  // training goes on while the save is written; the checkpoint is of k
    saver.wait();
  }
  // The resumed process starts from another seed's weights: everything must come from the checkpoint.
  const CheckpointPreview preview = preview_checkpoint(root);
  ASSERT_TRUE(preview.seed.has_value());
  EXPECT_EQ(preview.iteration, k);
  TrainingRun resumed(args, dtype, *preview.seed + 1000);
  resumed.load(root, {});
  EXPECT_EQ(resumed.iteration, k);
  // The seed drives dropout: a model built with another seed must take the checkpoint's (pretrain_gpt does).
  TrainingRun second(args, dtype, *preview.seed);
  second.load(root, {});
  std::vector<double> tail = second.steps(N);
  ASSERT_EQ(tail.size(), size_t(N - k));
  for (int64_t i = 0; i < N - k; ++i)
    EXPECT_EQ(tail[size_t(i)], full[size_t(k + i)]) << "iteration " << k + i + 1 << " differs after resuming";
}

TEST(Resume, BitExactOnMockDataWithDropout) {
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096"});
  expect_bit_exact_resume(f, DType::F32, false);
}

TEST(Resume, BitExactWithMoeLayersAndTheExpertBias) {
  // The expert bias moves once per step outside the optimizer: a resumed run must read it back (it travels as
  // the parameter ...router.expert_bias) to continue bit for bit; MoE on every other layer.
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096", "--disable-bias-linear", "--num-experts", "4",
                     "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--moe-router-score-function", "sigmoid",
                     "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05", "--moe-layer-freq", "2",
                     "--moe-aux-loss-coeff", "0.01"});
  expect_bit_exact_resume(f, DType::F32, false);
}

TEST(Resume, BitExactOnARealDatasetWithDropoutAndAsyncSave) {
  fs::path dir = testing::make_temp_dir("resume_data");
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--data-path", write_dataset(dir), "--split", "90,5,5", "--vocab-size", "512",
                     "--data-cache-path", (dir / "cache").string()});
  expect_bit_exact_resume(f, DType::F32, true);
}

TEST(Resume, BitExactInBf16WithFp32Masters) {
  fs::path dir = testing::make_temp_dir("resume_bf16");
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--data-path", write_dataset(dir), "--split", "90,5,5", "--vocab-size", "512",
                     "--data-cache-path", (dir / "cache").string(), "--bf16"});
  expect_bit_exact_resume(f, DType::BF16, false);
}

// With half the optimizer state offloaded to the host, the checkpoint carries the host masters and moments
// and a resumed run puts them back there.
TEST(Resume, BitExactWithOptimizerCpuOffload) {
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
                     "0.5"});
  expect_bit_exact_resume(f, DType::F32, true);
}

// FP8 on mock data: delayed scaling (its amax histories and scales are state the checkpoint must carry: the
// resumed process starts from fresh ones), tensorwise and blockwise scaling (no state).
const std::vector<std::string> kFp8Delayed = {"--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                                              "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"};

TEST(Resume, BitExactInFp8) {
  for (const std::vector<std::string>& recipe :
       {kFp8Delayed, std::vector<std::string>{"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"},
        std::vector<std::string>{"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}}) {
    SCOPED_TRACE(recipe[3]);
    std::vector<std::string> f = base_flags(8);
    f.insert(f.end(), {"--mock-data", "--vocab-size", "4096"});
    f.insert(f.end(), recipe.begin(), recipe.end());
    expect_bit_exact_resume(f, DType::F32, false);
  }
}

// --fp8-param-gather: the FP8 weights' only high-precision copy is the distributed optimizer's masters. The
// checkpoint saves the weights rounded from them (in bf16 for a bf16 run) and the masters; the resumed run loads
// the masters and the scaling state and quantises the weights again, bit for bit.
TEST(Resume, BitExactInFp8WithFp8ParamGather) {
  const std::vector<std::string> gather = {"--use-distributed-optimizer", "--fp8-param-gather"};
  for (const auto& [recipe, dtype] :
       {std::pair{kFp8Delayed, DType::F32},
        std::pair{std::vector<std::string>{"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--bf16"}, DType::BF16}}) {
    SCOPED_TRACE(recipe[3]);
    std::vector<std::string> f = base_flags(8);
    f.insert(f.end(), {"--mock-data", "--vocab-size", "4096"});
    f.insert(f.end(), recipe.begin(), recipe.end());
    f.insert(f.end(), gather.begin(), gather.end());
    expect_bit_exact_resume(f, dtype, false);
  }
}

// A checkpoint of a run with --fp8-param-gather loads into a run without it (its FP8 weights cast from the loaded
// ones) and that run's checkpoint back into one with it, which then trains on bit for bit like the first run.
TEST(Resume, Fp8ParamGatherCheckpointsLoadWithoutItAndBack) {
  std::vector<std::string> without = base_flags(8);
  without.insert(without.end(), {"--mock-data", "--vocab-size", "4096", "--use-distributed-optimizer"});
  without.insert(without.end(), kFp8Delayed.begin(), kFp8Delayed.end());
  std::vector<std::string> with = without;
  with.push_back("--fp8-param-gather");
  const int64_t N = 7, k = 3;
  std::vector<double> full = TrainingRun(make_args(with), DType::F32, 11).steps(N);
  fs::path there = testing::make_temp_dir("fp8_gather_to_plain"), back = testing::make_temp_dir("plain_to_fp8_gather");
  {
    TrainingRun first(make_args(with), DType::F32, 11);
    first.steps(k);
    save_training_checkpoint(*first.ctx, there, first.state(), {}, nullptr);
  }
  {
    TrainingRun plain(make_args(without), DType::F32, 99);
    plain.load(there, {});
    for (const nn::Parameter* p : plain.model->parameters()) EXPECT_FALSE(p->stored_in_fp8()) << p->name;
    save_training_checkpoint(*plain.ctx, back, plain.state(), {}, nullptr);
  }
  TrainingRun again(make_args(with), DType::F32, 11);
  again.load(back, {});
  int kept_in_fp8 = 0;
  for (const nn::Parameter* p : again.model->parameters()) kept_in_fp8 += p->stored_in_fp8() ? 1 : 0;
  EXPECT_EQ(kept_in_fp8, 8);  // QKV, projection, fc1 and fc2 of both layers
  const std::vector<double> tail = again.steps(N);
  ASSERT_EQ(tail.size(), size_t(N - k));
  for (int64_t i = 0; i < N - k; ++i)
    EXPECT_EQ(tail[size_t(i)], full[size_t(k + i)]) << "iteration " << k + i + 1 << " differs after the round trip";
}

// An FP8 run's checkpoint loads into a run without FP8 (the scaling state is left unread) and the other way
// round (the FP8 run starts from fresh scaling state: scales 1, empty histories); the weights are the saved ones
// and training continues.
TEST(Resume, Fp8AndPlainCheckpointsLoadIntoEachOther) {
  std::vector<std::string> plain = base_flags(8);
  plain.insert(plain.end(), {"--mock-data", "--vocab-size", "4096"});
  std::vector<std::string> fp8 = plain;
  fp8.insert(fp8.end(), kFp8Delayed.begin(), kFp8Delayed.end());
  auto expect_same_weights = [](TrainingRun& got, TrainingRun& saved) {
    const nn::ParameterList g = got.model->parameters(), w = saved.model->parameters();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_EQ(testing::to_doubles(*got.ctx, g[i]->value), testing::to_doubles(*saved.ctx, w[i]->value)) << w[i]->name;
  };
  auto expect_trains = [](TrainingRun& run) {
    for (double loss : run.steps(6)) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  };
  {
    fs::path root = testing::make_temp_dir("resume_fp8_to_plain");
    TrainingRun saved(make_args(fp8), DType::F32, 11);
    saved.steps(3);
    save_training_checkpoint(*saved.ctx, root, saved.state(), {}, nullptr);
    TrainingRun loaded(make_args(plain), DType::F32, 99);
    ASSERT_EQ(loaded.model->fp8_state(), nullptr);
    loaded.load(root, {});
    EXPECT_EQ(loaded.iteration, 3);
    EXPECT_EQ(loaded.trainer->optimizer().step_count(), 3);
    expect_same_weights(loaded, saved);
    expect_trains(loaded);
  }
  {
    fs::path root = testing::make_temp_dir("resume_plain_to_fp8");
    TrainingRun saved(make_args(plain), DType::F32, 11);
    saved.steps(3);
    save_training_checkpoint(*saved.ctx, root, saved.state(), {}, nullptr);
    TrainingRun loaded(make_args(fp8), DType::F32, 99);
    ASSERT_NE(loaded.model->fp8_state(), nullptr);
    loaded.load(root, {});
    EXPECT_EQ(loaded.iteration, 3);
    expect_same_weights(loaded, saved);
    const nn::Fp8ScalingState& state = *loaded.model->fp8_state();
    for (double v : testing::to_doubles(*loaded.ctx, state.forward_scale())) EXPECT_EQ(v, 1.0);
    for (double v : testing::to_doubles(*loaded.ctx, state.backward_scale())) EXPECT_EQ(v, 1.0);
    for (double v : testing::to_doubles(*loaded.ctx, state.forward_history())) EXPECT_EQ(v, 0.0);
    expect_trains(loaded);
    for (double v : testing::to_doubles(*loaded.ctx, state.forward_scale())) EXPECT_NE(v, 1.0);  // it records
  }
}

// The training state's integers come from a file: a float where an integer belongs (nlohmann would cast it, which
// is undefined behaviour out of range) is refused with the file and the field.
TEST(Resume, StateIntegersThatAreNotIntegersAreRefused) {
  std::vector<std::string> f = base_flags(4);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096"});
  const train::Arguments args = make_args(f);
  fs::path root = testing::make_temp_dir("resume_state_integers");
  TrainingRun saved(args, DType::F32, 11);
  saved.steps(1);
  save_training_checkpoint(*saved.ctx, root, saved.state(), {}, nullptr);
  const fs::path meta = preview_checkpoint(root).directory / "metadata.json";
  std::ifstream in(meta);
  const std::string good(std::istreambuf_iterator<char>(in), {});
  in.close();
  for (const std::string field : {"consumed_train_samples", "num_steps"}) {
    SCOPED_TRACE(field);
    const std::string from = "\"" + field + "\": ";
    const size_t at = good.find(from);
    ASSERT_NE(at, std::string::npos);
    std::string bad = good;
    bad.replace(at + from.size(), good.find_first_of(",\n}", at) - at - from.size(), "1e300");
    std::ofstream(meta, std::ios::trunc) << bad;
    TrainingRun loaded(args, DType::F32, 11);
    testing::expect_error([&] { loaded.load(root, {}); }, {meta.string(), field + " must be an integer", "1e+300"});
  }
  std::ofstream(meta, std::ios::trunc) << good;
  TrainingRun loaded(args, DType::F32, 11);
  loaded.load(root, {});
  EXPECT_EQ(loaded.iteration, 1);
}

TEST(Resume, FinetuneNoLoadOptimAndArchitectureMismatch) {
  fs::path dir = testing::make_temp_dir("resume_flags_data");
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--data-path", write_dataset(dir), "--split", "90,5,5", "--vocab-size", "512",
                     "--data-cache-path", (dir / "cache").string()});
  train::Arguments args = make_args(f);
  fs::path root = testing::make_temp_dir("resume_flags");
  TrainingRun first(args, DType::F32, 11);
  first.steps(3);
  save_training_checkpoint(*first.ctx, root, first.state(), {}, nullptr);
  const std::vector<double> saved_weights =
      testing::to_doubles(*first.ctx, first.model->parameters().front()->value);

  train::CheckpointArguments finetune;
  finetune.finetune = true;
  TrainingRun ft(args, DType::F32, 99);
  ft.load(root, finetune);
  EXPECT_EQ(ft.iteration, 0);
  EXPECT_EQ(ft.train.consumed(), 0);
  EXPECT_EQ(ft.trainer->optimizer().step_count(), 0);
  EXPECT_EQ(ft.trainer->scheduler().num_steps(), 0);
  EXPECT_EQ(testing::to_doubles(*ft.ctx, ft.model->parameters().front()->value), saved_weights);

  train::CheckpointArguments no_optim;
  no_optim.no_load_optim = true;
  TrainingRun no(args, DType::F32, 99);
  no.load(root, no_optim);
  EXPECT_EQ(no.iteration, 3);
  EXPECT_EQ(no.train.consumed(), 12);
  EXPECT_EQ(no.trainer->optimizer().step_count(), 0);

  // --no-save-optim: weights and counters only; loading rebuilds the optimizer.
  fs::path weights_only = testing::make_temp_dir("resume_no_save_optim");
  train::CheckpointArguments no_save;
  no_save.no_save_optim = true;
  no_save.no_save_rng = true;
  save_training_checkpoint(*first.ctx, weights_only, first.state(), no_save, nullptr);
  CheckpointReader wr = CheckpointReader::open(weights_only);
  for (const auto& [key, entry] : wr.metadata().tensors) EXPECT_NE(key.rfind("optimizer.", 0), 0u) << key;
  EXPECT_FALSE(wr.state().contains("optimizer"));
  EXPECT_FALSE(preview_checkpoint(weights_only).seed.has_value());
  TrainingRun from_weights(args, DType::F32, 99);
  from_weights.load(weights_only, {});
  EXPECT_EQ(from_weights.iteration, 3);
  EXPECT_EQ(from_weights.trainer->optimizer().step_count(), 0);

  // A bf16 run's checkpoint loads into an fp32 model from its fp32 masters (not the rounded weights).
  {
    std::vector<std::string> fb = f;
    fb.push_back("--bf16");
    train::Arguments bf_args = make_args(fb);
    fs::path bf_root = testing::make_temp_dir("resume_bf16_to_fp32");
    TrainingRun bf(bf_args, DType::BF16, 11);
    bf.steps(2);
    save_training_checkpoint(*bf.ctx, bf_root, bf.state(), {}, nullptr);
    const std::vector<double> master = testing::to_doubles(*bf.ctx, bf.trainer->optimizer().master(0));
    TrainingRun fp(args, DType::F32, 11);
    fp.load(bf_root, {});
    EXPECT_EQ(testing::to_doubles(*fp.ctx, fp.model->parameters().front()->value), master);
  }

  std::vector<std::string> g = f;
  g[3] = "64";  // --hidden-size
  g.insert(g.end(), {"--swiglu"});
  TrainingRun other(make_args(g), DType::F32, 11);
  testing::expect_error([&] { other.load(root, {}); },
                        {"another architecture", "--hidden-size: checkpoint 32, this run 64",
                         "--swiglu: checkpoint False, this run True", "--kv-channels: checkpoint 8, this run 16"});
}

TEST(Resume, SaveItemsSpreadReplicasOverDataParallelRanksAndFollowThePlacement) {
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096", "--bf16"});
  TrainingRun run(make_args(f), DType::BF16, 11);
  // Replicated optimizer at DP=3: each piece is replica 0 on exactly one of the three ranks.
  std::map<std::string, int> writers;
  size_t count = 0;
  for (int rank = 0; rank < 3; ++rank) {
    TrainingState s = run.state();
    s.dp_rank = rank;
    s.dp_size = 3;
    const std::vector<SaveItem> items = training_save_items(s, true);
    count = items.size();
    for (const SaveItem& item : items) {
      EXPECT_LT(item.spec.replica_id, 3) << item.spec.describe();
      if (item.spec.replica_id == 0) ++writers[item.spec.key];
    }
  }
  EXPECT_EQ(writers.size(), count);
  for (const auto& [key, n] : writers) EXPECT_EQ(n, 1) << key;
  // A placement (what a TP layer reports): the first weight as the second row block of a tensor twice as
  // tall, and the final norm as a copy held by TP rank 1 (replica ids from DP upwards: never written here).
  nn::ParameterList params = run.model->parameters();
  const nn::Parameter* first = params.front();
  TrainingState s = run.state();
  s.placement = [&](const nn::Parameter& p) {
    ParameterPlacement where = tensor_parallel_placement(p);  // at TP = 1: the whole tensor
    EXPECT_EQ(where.boxes.size(), 1u) << p.name;
    EXPECT_EQ(where.tp_replica, 0) << p.name;
    if (&p == first) {
      where.global_shape[0] *= 2;
      where.boxes[0].global_offset[0] = p.value.dim(0);
    }
    if (p.name.find("final_layernorm") != std::string::npos) where.tp_replica = 1;
    return where;
  };
  for (const SaveItem& item : training_save_items(s, true)) {
    if (item.spec.key.find(first->name) != std::string::npos) {
      EXPECT_EQ(item.spec.global_shape[0], 2 * first->value.dim(0)) << item.spec.describe();
      EXPECT_EQ(item.spec.global_offset[0], first->value.dim(0)) << item.spec.describe();
    }
    if (item.spec.key.find("final_layernorm") != std::string::npos) {
      EXPECT_EQ(item.spec.replica_id, 1) << item.spec.key;
    }
  }
}

TEST(Resume, SaveItemsSplitALocalTensorOfTwoBoxesAndRangesCrossingThem) {
  // SwiGLU's fc1 under TP: the local tensor [gate_r; up_r] is two row boxes of the whole [2F, h]. Here the
  // first weight (R rows) plays it: local rows [0, R/2) are global rows [R/2, R) and local rows [R/2, R) are
  // global rows [3R/2, 2R) of a tensor 2R tall (TP rank 1 of 2). A distributed-optimizer range crossing the
  // boundary becomes one flat piece per box; a whole local tensor, two box pieces.
  std::vector<std::string> f = base_flags(8);
  f.insert(f.end(), {"--mock-data", "--vocab-size", "4096"});
  TrainingRun run(make_args(f), DType::F32, 11);
  nn::Parameter* first = run.model->parameters().front();
  const int64_t R = first->value.dim(0), C = first->value.dim(1);
  ASSERT_EQ(R % 2, 0);
  TrainingState s = run.state();
  s.placement = [&](const nn::Parameter& p) {
    ParameterPlacement where = tensor_parallel_placement(p);
    if (&p != first) return where;
    where.global_shape = {2 * R, C};
    where.boxes = {PlacementBox{0, {R / 2, 0}, {R / 2, C}}, PlacementBox{R / 2, {3 * R / 2, 0}, {R / 2, C}}};
    return where;
  };
  auto pieces_of_first = [&](const TrainingState& state) {
    std::vector<SaveItem> out;
    for (SaveItem& item : training_save_items(state, false))
      if (item.spec.key == first->name) out.push_back(std::move(item));
    return out;
  };
  const std::vector<SaveItem> whole = pieces_of_first(s);
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_FALSE(whole[0].spec.flat);
  EXPECT_EQ(whole[0].spec.global_offset, (std::vector<int64_t>{R / 2, 0}));
  EXPECT_EQ(whole[1].spec.global_offset, (std::vector<int64_t>{3 * R / 2, 0}));
  EXPECT_EQ(whole[1].data.data_ptr(), first->value.slice(R / 2, R).data_ptr());
  // A range from row 0 (offset 5) to 3 elements before the end: two flat pieces.
  s.optimizer = nullptr;
  s.optimizer_ranges = {{first, 5, R * C - 3}};
  const std::vector<SaveItem> ranged = pieces_of_first(s);
  ASSERT_EQ(ranged.size(), 2u);
  EXPECT_TRUE(ranged[0].spec.flat && ranged[1].spec.flat);
  EXPECT_EQ(ranged[0].spec.flat_begin, 5);
  EXPECT_EQ(ranged[0].spec.flat_end, R / 2 * C);
  EXPECT_EQ(ranged[1].spec.flat_begin, 0);
  EXPECT_EQ(ranged[1].spec.flat_end, R / 2 * C - 3);
  EXPECT_EQ(ranged[1].spec.global_offset, (std::vector<int64_t>{3 * R / 2, 0}));
  EXPECT_EQ(ranged[0].data.numel() + ranged[1].data.numel(), R * C - 8);
  EXPECT_EQ(ranged[1].data.data_ptr(), first->value.slice(R / 2, R).data_ptr());
  // A placement that does not tile the local tensor is refused, naming the parameter.
  s.optimizer_ranges.clear();
  s.placement = [&](const nn::Parameter& p) {
    ParameterPlacement where = tensor_parallel_placement(p);
    if (&p == first) where.boxes[0].shape[0] = R / 2;
    return where;
  };
  testing::expect_error([&] { training_save_items(s, false); }, {first->name, "local elements"});
}

#ifdef PRETRAIN_GPT_EXE
// Runs pretrain_gpt (under `launcher`, e.g. mpiexec) and returns its log lines' "iteration N ... lm loss ...
// grad norm" parts, by iteration.
std::map<int64_t, std::string> run_pretrain(const std::string& flags, const fs::path& log,
                                            const std::string& launcher = "") {
  const std::string cmd = launcher + std::string(PRETRAIN_GPT_EXE) + " " + flags + " > " + log.string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(log);
  std::map<int64_t, std::string> out;
  const std::regex line(R"(iteration +(\d+)/ +\d+ \|.*(lm loss: [^|]*\|.*grad norm: [^|]*\|))");
  for (std::string s; std::getline(f, s);) {
    std::smatch m;
    if (std::regex_search(s, m, line)) out[std::stoll(m[1])] = m[2];
  }
  return out;
}

TEST(Resume, PretrainGptSaveExitAndLoadContinueTheSameLosses) {
  fs::path dir = testing::make_temp_dir("resume_binary");
  std::string flags;
  for (const std::string& s : base_flags(10)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string();
  auto full = run_pretrain(flags, dir / "full.log");
  ASSERT_EQ(full.size(), 10u);
  const std::string ckpt = (dir / "ckpt").string();
  auto first = run_pretrain(flags + " --save " + ckpt + " --save-interval 2 --exit-interval 6 --async-save --keep-last 2",
                            dir / "first.log");
  EXPECT_EQ(first.size(), 6u);
  EXPECT_EQ(saved_iterations(ckpt), (std::vector<int64_t>{4, 6}));
  auto second = run_pretrain(flags + " --load " + ckpt, dir / "second.log");
  ASSERT_EQ(second.size(), 4u) << "iterations 7..10 after resuming";
  for (int64_t it = 7; it <= 10; ++it) EXPECT_EQ(second[it], full[it]) << "iteration " << it;
  std::ifstream log(dir / "second.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("resuming at iteration 7"), std::string::npos);
  // --ckpt-step (Megatron's): an older saved iteration than the tracker's, continuing from there.
  auto older = run_pretrain(flags + " --load " + ckpt + " --ckpt-step 4", dir / "older.log");
  ASSERT_EQ(older.size(), 6u) << "iterations 5..10 after resuming at the fourth";
  for (int64_t it = 5; it <= 10; ++it) EXPECT_EQ(older[it], full[it]) << "iteration " << it;
  // An iteration that was not kept: refused, naming the ones that were.
  const std::string missing = std::string(PRETRAIN_GPT_EXE) + " " + flags + " --load " + ckpt + " --ckpt-step 2 > " +
                              (dir / "missing.log").string() + " 2>&1";
  EXPECT_NE(std::system(missing.c_str()), 0);
  std::ifstream missing_log(dir / "missing.log");
  text.assign(std::istreambuf_iterator<char>(missing_log), {});
  EXPECT_NE(text.find("--ckpt-step 2: "), std::string::npos) << text;
  EXPECT_NE(text.find("--load's saved iterations: 4, 6"), std::string::npos) << text;
  fs::remove_all(dir);
}

// --use-checkpoint-args: a run that names no architecture flag (not even --num-layers or the vocabulary) takes
// them from the checkpoint's saved args (Megatron's load_args_from_checkpoint) and continues with the losses of
// the run that gave them all.
TEST(Resume, UseCheckpointArgsTakesTheArchitectureFromTheCheckpoint) {
  fs::path dir = testing::make_temp_dir("resume_ckpt_args");
  const std::string model = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2 --seq-length 16 "
                            "--swiglu --normalization RMSNorm --position-embedding-type rope --rotary-base 500 "
                            "--untie-embeddings-and-output-weights --disable-bias-linear --hidden-dropout 0.2 "
                            "--attention-dropout 0 --vocab-size 4096 ";
  const std::string training = "--micro-batch-size 2 --global-batch-size 4 --train-iters 6 --lr 3e-3 --min-lr 3e-4 "
                               "--lr-decay-style cosine --lr-warmup-iters 2 --eval-iters 0 --seed 11 --mock-data "
                               "--device cpu --log-interval 1 ";
  auto full = run_pretrain(model + training, dir / "full.log");
  ASSERT_EQ(full.size(), 6u);
  const std::string ckpt = (dir / "ckpt").string();
  run_pretrain(model + training + "--save " + ckpt + " --exit-interval 3", dir / "first.log");
  auto second = run_pretrain(training + "--load " + ckpt + " --use-checkpoint-args", dir / "second.log");
  ASSERT_EQ(second.size(), 3u) << "iterations 4..6 after resuming";
  for (int64_t it = 4; it <= 6; ++it) EXPECT_EQ(second[it], full[it]) << "iteration " << it;
  std::ifstream log(dir / "second.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("--use-checkpoint-args: --num-layers 2 (from the checkpoint)"), std::string::npos) << text;
  fs::remove_all(dir);
}

#ifdef MPIEXEC
TEST(Resume, PretrainGptDataParallelSavesResumeAndLoadInOneProcess) {
  // Two ranks with the distributed optimizer and asynchronous saves (published by the per-iteration poll);
  // resumed at two ranks it continues bit for bit; one process with the replicated optimizer loads it too.
  fs::path dir = testing::make_temp_dir("resume_binary_dp");
  std::string flags;
  for (const std::string& s : base_flags(10)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string();
  const std::string two = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                          " --oversubscribe -np 2 ";
  const std::string dist = " --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4000";
  auto full = run_pretrain(flags + dist, dir / "full.log", two);
  ASSERT_EQ(full.size(), 10u);
  const std::string ckpt = (dir / "ckpt").string();
  auto first = run_pretrain(flags + dist + " --save " + ckpt + " --save-interval 2 --exit-interval 6 --async-save",
                            dir / "first.log", two);
  EXPECT_EQ(first.size(), 6u);
  EXPECT_EQ(saved_iterations(ckpt), (std::vector<int64_t>{2, 4, 6}));
  CheckpointReader reader = CheckpointReader::open(ckpt);
  EXPECT_TRUE(fs::exists(reader.directory() / "rank_00001.safetensors"));
  auto second = run_pretrain(flags + dist + " --load " + ckpt, dir / "second.log", two);
  ASSERT_EQ(second.size(), 4u) << "iterations 7..10 after resuming";
  for (int64_t it = 7; it <= 10; ++it) EXPECT_EQ(second[it], full[it]) << "iteration " << it;
  auto single = run_pretrain(flags + " --load " + ckpt, dir / "single.log");
  EXPECT_EQ(single.size(), 4u);
  std::ifstream log(dir / "single.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("resuming at iteration 7"), std::string::npos);
}

// A value printed in a log line part ("lm loss: 6.123456E+00 | ... grad norm: 1.234 |").
double logged(const std::string& line, const std::string& name) {
  std::smatch m;
  const std::regex value(name + R"(: +([-+0-9.eE]+))");
  EXPECT_TRUE(std::regex_search(line, m, value)) << name << " in " << line;
  return m.size() > 1 ? std::stod(m[1]) : NAN;
}

TEST(Resume, PretrainGptTensorParallelSavesLoadAtTp1AndBack) {
  // TP=2 x DP=2 (four ranks, sequence parallel, distributed optimizer) saves at iteration 4 (asynchronously)
  // and exits; one process at TP=1 loads it and continues with the uninterrupted TP=2 x DP=2 run's losses
  // (within 1e-5 relative: the reductions sum in another order; the log prints 7 digits) and gradient norms (as
  // printed, 3 decimals). Its own checkpoint then loads at TP=2 x DP=2 again.
  fs::path dir = testing::make_temp_dir("resume_binary_tp");
  std::string flags;
  for (const std::string& s : base_flags(8)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string();
  const std::string four = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                           " --oversubscribe -np 4 ";
  const std::string tp2 = " --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer";
  auto full = run_pretrain(flags + tp2, dir / "full.log", four);
  ASSERT_EQ(full.size(), 8u);
  const std::string ckpt = (dir / "ckpt").string(), ckpt1 = (dir / "ckpt_tp1").string();
  auto first =
      run_pretrain(flags + tp2 + " --save " + ckpt + " --exit-interval 4 --async-save", dir / "first.log", four);
  EXPECT_EQ(first.size(), 4u);
  EXPECT_EQ(saved_iterations(ckpt), (std::vector<int64_t>{4}));
  EXPECT_TRUE(fs::exists(CheckpointReader::open(ckpt).directory() / "rank_00003.safetensors"));
  auto single = run_pretrain(flags + " --load " + ckpt + " --save " + ckpt1, dir / "single.log");
  ASSERT_EQ(single.size(), 4u) << "iterations 5..8 at TP=1";
  for (int64_t it = 5; it <= 8; ++it) {
    const double want = logged(full[it], "lm loss"), got = logged(single[it], "lm loss");
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << "iteration " << it << ": " << single[it] << " vs " << full[it];
    EXPECT_NEAR(logged(single[it], "grad norm"), logged(full[it], "grad norm"), 1.01e-3) << "iteration " << it;
  }
  auto back = run_pretrain(flags + tp2 + " --load " + ckpt1 + " --train-iters 10", dir / "back.log", four);
  EXPECT_EQ(back.size(), 2u) << "iterations 9..10 at TP=2 x DP=2";
  std::ifstream log(dir / "back.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("resuming at iteration 9"), std::string::npos);
}

TEST(Resume, PretrainGptPipelineSavesResumeAndLoadAtPp1AndBack) {
  // A 4-layer GPT (tied embeddings: the last stage's copy is not saved, and loads from the same key) at PP=2
  // resumes at PP=2 bit for bit; one process at PP=1 loads its iteration-4 checkpoint and continues with the
  // uninterrupted PP=2 run's losses (within 1e-5 relative) and gradient norms (as printed); that run's own
  // checkpoint loads at interleaved PP=2 x 2 chunks again.
  fs::path dir = testing::make_temp_dir("resume_binary_pp");
  std::vector<std::string> base = base_flags(8);
  base[1] = "4";  // --num-layers
  std::string flags;
  for (const std::string& s : base) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string();
  const std::string two = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                          " --oversubscribe -np 2 ";
  const std::string pp2 = " --pipeline-model-parallel-size 2";
  auto full = run_pretrain(flags + pp2, dir / "full.log", two);
  ASSERT_EQ(full.size(), 8u);
  const std::string ckpt = (dir / "ckpt").string(), ckpt1 = (dir / "ckpt_pp1").string();
  auto first = run_pretrain(flags + pp2 + " --save " + ckpt + " --save-interval 4 --exit-interval 4", dir / "first.log", two);
  EXPECT_EQ(first.size(), 4u);
  auto resumed = run_pretrain(flags + pp2 + " --load " + ckpt, dir / "resumed.log", two);
  ASSERT_EQ(resumed.size(), 4u);
  for (int64_t it = 5; it <= 8; ++it) EXPECT_EQ(resumed[it], full[it]) << "PP=2 resumed, iteration " << it;
  auto single = run_pretrain(flags + " --load " + ckpt + " --save " + ckpt1, dir / "single.log");
  ASSERT_EQ(single.size(), 4u) << "iterations 5..8 at PP=1";
  for (int64_t it = 5; it <= 8; ++it) {
    const double want = logged(full[it], "lm loss"), got = logged(single[it], "lm loss");
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << "iteration " << it << ": " << single[it] << " vs " << full[it];
    EXPECT_NEAR(logged(single[it], "grad norm"), logged(full[it], "grad norm"), 1.01e-3) << "iteration " << it;
  }
  auto back = run_pretrain(flags + pp2 + " --virtual-pipeline-model-parallel-size 2 --load " + ckpt1 + " --train-iters 10",
                           dir / "back.log", two);
  EXPECT_EQ(back.size(), 2u) << "iterations 9..10 at PP=2 x 2 chunks";
  std::ifstream log(dir / "back.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("resuming at iteration 9"), std::string::npos);
}

TEST(Resume, PretrainGptContextParallelSavesLoadAtCp1AndBack) {
  // CP=2 (two ranks, the distributed optimizer sharded over DP x CP = 2, dropout on) saves at iteration 4
  // and exits; one process at CP=1 loads it and continues with the uninterrupted CP=2 run's losses (within
  // 1e-5 relative: the loss and gradients are summed over the CP ranks in another order) and gradient norms
  // (as printed). Its own checkpoint then loads at CP=2 again: context parallelism splits activations only,
  // so the checkpoint's tensors do not change with it, only the optimizer shards (over DP x CP) do.
  fs::path dir = testing::make_temp_dir("resume_binary_cp");
  std::string flags;
  for (const std::string& s : base_flags(8)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string() + " --use-distributed-optimizer";
  const std::string two = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                          " --oversubscribe -np 2 ";
  const std::string cp2 = " --context-parallel-size 2";
  auto full = run_pretrain(flags + cp2, dir / "full.log", two);
  ASSERT_EQ(full.size(), 8u);
  const std::string ckpt = (dir / "ckpt").string(), ckpt1 = (dir / "ckpt_cp1").string();
  auto first = run_pretrain(flags + cp2 + " --save " + ckpt + " --save-interval 4 --exit-interval 4", dir / "first.log", two);
  EXPECT_EQ(first.size(), 4u);
  EXPECT_TRUE(fs::exists(CheckpointReader::open(ckpt).directory() / "rank_00001.safetensors"));
  auto single = run_pretrain(flags + " --load " + ckpt + " --save " + ckpt1, dir / "single.log");
  ASSERT_EQ(single.size(), 4u) << "iterations 5..8 at CP=1";
  for (int64_t it = 5; it <= 8; ++it) {
    const double want = logged(full[it], "lm loss"), got = logged(single[it], "lm loss");
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << "iteration " << it << ": " << single[it] << " vs " << full[it];
    EXPECT_NEAR(logged(single[it], "grad norm"), logged(full[it], "grad norm"), 1.01e-3) << "iteration " << it;
  }
  auto back = run_pretrain(flags + cp2 + " --load " + ckpt1 + " --train-iters 10", dir / "back.log", two);
  EXPECT_EQ(back.size(), 2u) << "iterations 9..10 at CP=2";
  std::ifstream log(dir / "back.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("resuming at iteration 9"), std::string::npos);
}

TEST(Resume, PretrainGptFsdpCheckpointsCrossWithTheDistributedOptimizer) {
  // FSDP with sharded parameters (two ranks, dropout on, asynchronous saves) saves at iteration 4 and exits;
  // resumed under FSDP it continues bit for bit; the distributed optimizer (size buckets, whole parameters)
  // loads the same checkpoint and continues with the same losses and gradient norms (within 1e-5: the
  // gradients are summed per micro-batch and module group there, once per bucket here), and its own
  // checkpoint loads under FSDP optim_grads again. The layout is the distributed optimizer's: the optimizer
  // state saved as ranges of each parameter, whatever buckets held them.
  fs::path dir = testing::make_temp_dir("resume_binary_fsdp");
  std::string flags;
  for (const std::string& s : base_flags(8)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string();
  const std::string two = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                          " --oversubscribe -np 2 ";
  const std::string fsdp = " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params";
  const std::string dist = " --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4000";
  auto full = run_pretrain(flags + fsdp, dir / "full.log", two);
  ASSERT_EQ(full.size(), 8u);
  const std::string ckpt = (dir / "ckpt").string(), ckpt_dist = (dir / "ckpt_dist").string();
  auto first = run_pretrain(flags + fsdp + " --save " + ckpt + " --save-interval 4 --exit-interval 4 --async-save",
                            dir / "first.log", two);
  EXPECT_EQ(first.size(), 4u);
  auto resumed = run_pretrain(flags + fsdp + " --load " + ckpt, dir / "resumed.log", two);
  ASSERT_EQ(resumed.size(), 4u) << "iterations 5..8 under FSDP";
  for (int64_t it = 5; it <= 8; ++it) EXPECT_EQ(resumed[it], full[it]) << "iteration " << it;
  auto crossed = run_pretrain(flags + dist + " --load " + ckpt + " --save " + ckpt_dist + " --save-interval 6 " +
                              "--exit-interval 6", dir / "crossed.log", two);
  ASSERT_EQ(crossed.size(), 2u) << "iterations 5..6 with the distributed optimizer";
  for (int64_t it = 5; it <= 6; ++it) {
    const double want = logged(full[it], "lm loss"), got = logged(crossed[it], "lm loss");
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << "iteration " << it << ": " << crossed[it] << " vs " << full[it];
    EXPECT_NEAR(logged(crossed[it], "grad norm"), logged(full[it], "grad norm"), 1.01e-3) << "iteration " << it;
  }
  auto back = run_pretrain(flags + " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --load " +
                               ckpt_dist, dir / "back.log", two);
  ASSERT_EQ(back.size(), 2u) << "iterations 7..8 under FSDP optim_grads";
  for (int64_t it = 7; it <= 8; ++it) {
    const double want = logged(full[it], "lm loss"), got = logged(back[it], "lm loss");
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << "iteration " << it << ": " << back[it] << " vs " << full[it];
  }
}

TEST(Resume, PretrainGptExpertParallelSavesAtEp4AndContinuesAtEp2) {
  // An MoE GPT (4 experts, top-2, the switch loss and the z-loss on) on four ranks at EP=4 (the experts folded
  // over DP=4, distributed optimizer) saves at iteration 4 and exits; the same four ranks at EP=2 load it and
  // continue with the uninterrupted EP=4 run's losses and router losses (within 1e-5 relative: the expert
  // gradients are summed in another order) and gradient norms (as printed); a one-rank run (EP=1) loads the
  // EP=2 run's checkpoint and continues too. Expert weights are saved with their global expert ids, so each
  // layout reads the experts it holds.
  fs::path dir = testing::make_temp_dir("resume_binary_ep");
  std::string flags;
  for (const std::string& s : base_flags(8)) flags += s + " ";
  flags += "--device cpu --log-interval 1 --data-path " + write_dataset(dir) + " --split 90,5,5 --vocab-size 512 " +
           "--data-cache-path " + (dir / "cache").string() + " --use-distributed-optimizer --disable-bias-linear " +
           "--swiglu --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 0.1 " +
           "--moe-z-loss-coeff 0.01 --moe-token-dispatcher-type alltoall --micro-batch-size 1";
  const std::string four = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIEXEC +
                           " --oversubscribe -np 4 ";
  const std::string ep4 = " --expert-model-parallel-size 4", ep2 = " --expert-model-parallel-size 2";
  auto full = run_pretrain(flags + ep4, dir / "full.log", four);
  ASSERT_EQ(full.size(), 8u);
  const std::string ckpt = (dir / "ckpt").string(), ckpt2 = (dir / "ckpt_ep2").string();
  auto first = run_pretrain(flags + ep4 + " --save " + ckpt + " --save-interval 4 --exit-interval 4", dir / "first.log", four);
  EXPECT_EQ(first.size(), 4u);
  auto second = run_pretrain(flags + ep2 + " --load " + ckpt + " --save " + ckpt2 + " --save-interval 8", dir / "second.log", four);
  ASSERT_EQ(second.size(), 4u) << "iterations 5..8 at EP=2";
  for (int64_t it = 5; it <= 8; ++it)
    for (const char* key : {"lm loss", "load_balancing_loss", "z_loss"}) {
      const double want = logged(full[it], key), got = logged(second[it], key);
      EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << key << ", iteration " << it << ": " << second[it];
    }
  for (int64_t it = 5; it <= 8; ++it)
    EXPECT_NEAR(logged(second[it], "grad norm"), logged(full[it], "grad norm"), 1.01e-3) << "iteration " << it;
  auto single = run_pretrain(flags + " --load " + ckpt2 + " --train-iters 10", dir / "single.log");
  EXPECT_EQ(single.size(), 2u) << "iterations 9..10 at EP=1 on one rank";
}
#endif
#endif

}  // namespace
}  // namespace megatron::checkpoint
