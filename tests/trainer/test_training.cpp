// A tiny GPT trained on CPU must learn: Megatron's mock data (runs of consecutive token ids) is predictable,
// so the loss must fall well below the uniform-guess level ln(V) within a few dozen iterations. Also: a
// bf16-free fp32 run is deterministic (two runs, identical losses); --decoupled-lr drives the embeddings and the
// output layer apart; a NaN loss or gradient norm stops the run, naming the parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "harness.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/finite_check.h"
#include "megatron/trainer/trainer.h"

namespace megatron::trainer {
namespace {

train::Arguments tiny_args(int64_t iters) {
  train::Arguments a = train::parse_arguments(
      {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
       "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", std::to_string(iters), "--lr", "3e-3",
       "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "5", "--mock-data", "--vocab-size",
       "4096", "--eval-interval", "1000", "--eval-iters", "2", "--hidden-dropout", "0", "--attention-dropout", "0",
       "--seed", "7"});
  a.parallel.world_size = 1;
  train::resolve_and_validate(a);
  return a;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<bool> skipped;
  std::vector<double> loss_scales;  // after each iteration (1 without a scaler)
};

// Trains on `device` in `dtype` (F32 on the CPU; BF16 or F16 on CUDA).
TrainRun train_run(const train::Arguments& a, Device device, DType dtype, double* valid_loss = nullptr) {
  auto ctx = Context::create(device);
  ctx->set_deterministic(a.training.deterministic_mode);
  nn::TransformerConfig config = train::transformer_config(a.model, dtype, uint64_t(a.training.seed));
  config.deterministic = a.training.deterministic_mode;
  nn::GPTModel model(*ctx, config);
  TrainingData data(a, a.model.vocab_size - 1);
  SampleStream train = data.stream(data::Split::train), valid = data.stream(data::Split::valid);
  Trainer trainer(*ctx, a, model);
  TrainRun run;
  for (int64_t it = 1; it <= a.training.train_iters; ++it) {
    StepResult r = trainer.train_step(train, it);
    run.losses.push_back(r.loss);
    run.skipped.push_back(r.skipped);
    run.loss_scales.push_back(trainer.loss_scaler() ? trainer.loss_scaler()->scale() : 1.0);
  }
  if (valid_loss) *valid_loss = trainer.evaluate(valid);
  return run;
}

std::vector<double> train_losses(const train::Arguments& a, double* valid_loss) {
  auto ctx = Context::cpu();
  nn::GPTModel model(*ctx, train::transformer_config(a.model, DType::F32, uint64_t(a.training.seed)));
  TrainingData data(a, a.model.vocab_size - 1);
  SampleStream train = data.stream(data::Split::train), valid = data.stream(data::Split::valid);
  Trainer trainer(*ctx, a, model);
  std::vector<double> losses;
  for (int64_t it = 1; it <= a.training.train_iters; ++it) losses.push_back(trainer.train_step(train, it).loss);
  if (valid_loss) *valid_loss = trainer.evaluate(valid);
  return losses;
}

TEST(Training, TinyModelLearnsMockData) {
  train::Arguments a = tiny_args(80);
  double valid = 0;
  std::vector<double> losses = train_losses(a, &valid);
  const double uniform = std::log(4096.0);
  EXPECT_NEAR(losses.front(), uniform, 0.3) << "an untrained model should be near ln(V)";
  double last = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) last += losses[i] / 10;
  // Stated threshold: from ln(4096) = 8.32 to below 7.0 in 80 iterations (a measured run reaches ~6.7).
  EXPECT_LT(last, 7.0) << "mean training loss of the last 10 iterations";
  EXPECT_LT(valid, 7.0) << "validation loss after training";
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(Training, SameSeedSameLosses) {
  train::Arguments a = tiny_args(8);
  EXPECT_EQ(train_losses(a, nullptr), train_losses(a, nullptr));
}

// Megatron's default dropouts (attention and hidden 0.1) in --deterministic-mode: two runs give the same bits,
// attention dropout's masks move the losses (without it the first loss differs), and the model still learns.
TEST(Training, MegatronDefaultDropoutsAreReproducibleAndTrain) {
  train::Arguments a = tiny_args(30);
  a.model.attention_dropout = a.model.hidden_dropout = 0.1;
  a.training.deterministic_mode = true;
  const std::vector<double> first = train_run(a, Device::cpu(), DType::F32).losses;
  EXPECT_EQ(train_run(a, Device::cpu(), DType::F32).losses, first);
  train::Arguments no_attention_dropout = a;
  no_attention_dropout.model.attention_dropout = 0;
  EXPECT_NE(train_run(no_attention_dropout, Device::cpu(), DType::F32).losses[0], first[0]);
  for (double l : first) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(first.back(), first.front() - 0.3) << "and it trains";
}

// Megatron's --check-for-nan-in-loss-and-grad (on by default): a learning rate of 1e30 sends the weights to
// infinity in the first update, so the second iteration's loss and gradients are NaN; the run stops there with
// the iteration, the value and the parameters named, before the optimizer writes NaN into the weights. With
// --no-check-for-nan-in-loss-and-grad it trains on (Megatron's behaviour with the check off).
TEST(Training, NanLossOrGradientNormStopsTheRunByDefault) {
  train::Arguments a = tiny_args(8);
  a.training.train_iters = 3;
  a.training.lr = 1e30;
  a.training.lr_warmup_iters = 0;
  auto ctx = Context::cpu();
  nn::GPTModel model(*ctx, train::transformer_config(a.model, DType::F32, uint64_t(a.training.seed)));
  TrainingData data(a, a.model.vocab_size - 1);
  SampleStream train = data.stream(data::Split::train);
  Trainer trainer(*ctx, a, model);
  EXPECT_TRUE(std::isfinite(trainer.train_step(train, 1).loss));
  testing::expect_error([&] { trainer.train_step(train, 2); },
                        {"iteration 2: the loss is NaN and the gradient norm NaN", "holds NaN or Inf gradients in",
                         "embedding.word_embeddings.weight, ", ", ..., ", "decoder.final_layernorm.bias)",
                         "--no-check-for-nan-in-loss-and-grad"});

  a.training.no_check_for_nan_in_loss_and_grad = true;
  const std::vector<double> losses = train_losses(a, nullptr);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_FALSE(std::isfinite(losses[2])) << "unchecked, the run goes on with NaN weights";
}

// The parameters named are exactly those whose gradient holds a NaN or an Inf, in order.
TEST(Training, NonfiniteGradientsNamesExactlyTheParametersWithNanOrInf) {
  Context& ctx = testing::cpu_context();
  std::vector<nn::Parameter> params;
  for (const char* name : {"a", "b", "c", "d"}) {
    params.push_back(nn::make_parameter(ctx, name, Shape{3, 5}, DType::F32, false));
    testing::fill_random(params.back().main_grad, testing::seed_from(name));
  }
  params[1].main_grad.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  params[3].main_grad.data<float>()[14] = -std::numeric_limits<float>::infinity();
  nn::ParameterList list;
  for (nn::Parameter& p : params) list.push_back(&p);
  EXPECT_EQ(nonfinite_gradients(ctx, list), (std::vector<std::string>{"b", "d"}));
  EXPECT_NO_THROW(check_finite_step(ctx, 5, 2.5, 1.0, list, 0));
  EXPECT_NO_THROW(check_finite_step(ctx, 5, 2.5, std::nullopt, list, 0));
  testing::expect_error([&] { check_finite_step(ctx, 5, 2.5, std::numeric_limits<double>::infinity(), list, 3); },
                        {"iteration 5: the gradient norm is Inf",
                         "rank 3 holds NaN or Inf gradients in 2 of 4 parameters: b, d"});
  const nn::ParameterList finite = {&params[0], &params[2]};  // the NaN came from elsewhere (another rank, say)
  testing::expect_error([&] { check_finite_step(ctx, 6, std::nan(""), 1.0, finite, 2); },
                        {"iteration 6: the loss is NaN (no gradient that rank 2 holds whole has a NaN or Inf"});
}

// An evaluation whose loss is not finite stops the run too (Megatron's check covers its evaluation), naming where.
TEST(Training, NanValidationLossStopsTheRun) {
  EXPECT_NO_THROW(check_finite_evaluation("iteration 10", 4.5));
  testing::expect_error([] { check_finite_evaluation("iteration 10", std::nan("")); },
                        {"the validation loss at iteration 10 is NaN", "--no-check-for-nan-in-loss-and-grad"});
  testing::expect_error(
      [] { check_finite_evaluation("iteration 20 on test set", std::numeric_limits<double>::infinity()); },
      {"the validation loss at iteration 20 on test set is Inf"});
}

// Under fp16's dynamic loss scaling an overflow skips the step, so the check is off there (Megatron's rule);
// with a constant --loss-scale it stays on.
TEST(Training, NanCheckIsOffUnderDynamicLossScalingOnly) {
  train::Arguments a = tiny_args(8);
  EXPECT_FALSE(a.training.no_check_for_nan_in_loss_and_grad);
  a.training.fp16 = true;
  train::Arguments constant = a;
  constant.training.loss_scale = 1024;
  train::resolve_and_validate(a);
  train::resolve_and_validate(constant);
  EXPECT_TRUE(a.training.no_check_for_nan_in_loss_and_grad);
  EXPECT_FALSE(constant.training.no_check_for_nan_in_loss_and_grad);
  const train::Arguments unchecked = train::parse_arguments({"--no-check-for-nan-in-loss-and-grad"});
  EXPECT_TRUE(unchecked.training.no_check_for_nan_in_loss_and_grad);
}

// --decoupled-lr / --decoupled-min-lr: the word embeddings and the output layer follow their own peak and floor
// on the same schedule. Equal to --lr / --min-lr they change nothing (every loss and parameter bit); at twice
// --lr the first update (AdamW's first step is linear in lr: -lr (m / (sqrt(v) + eps) + wd p)) moves exactly
// those two weights twice as far and leaves every other parameter as it was.
TEST(Training, DecoupledLrSchedulesTheEmbeddingsAndOutputLayerApart) {
  // tiny_args' model and schedule, untied, without warmup (the first update at the peak learning rate).
  auto args = [](int64_t iters, std::vector<std::string> decoupled) {
    std::vector<std::string> flags = {
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", std::to_string(iters), "--lr", "3e-3",
        "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--mock-data", "--vocab-size", "4096", "--eval-interval",
        "1000", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
        "--untie-embeddings-and-output-weights"};
    flags.insert(flags.end(), decoupled.begin(), decoupled.end());
    train::Arguments a = train::parse_arguments(flags);
    a.parallel.world_size = 1;
    train::resolve_and_validate(a);
    return a;
  };
  auto run = [&](std::vector<std::string> decoupled, int64_t iters) {
    const train::Arguments a = args(iters, std::move(decoupled));
    auto ctx = Context::cpu();
    nn::GPTModel model(*ctx, train::transformer_config(a.model, DType::F32, uint64_t(a.training.seed)));
    std::map<std::string, std::vector<double>> before, after;
    for (nn::Parameter* p : model.parameters()) before[p->name] = testing::to_doubles(*ctx, p->value);
    TrainingData data(a, a.model.vocab_size - 1);
    SampleStream train = data.stream(data::Split::train);
    Trainer trainer(*ctx, a, model);
    std::vector<double> losses;
    for (int64_t it = 1; it <= iters; ++it) losses.push_back(trainer.train_step(train, it).loss);
    for (nn::Parameter* p : model.parameters()) after[p->name] = testing::to_doubles(*ctx, p->value);
    return std::tuple{losses, before, after};
  };
  const auto [losses, before, after] = run({}, 4);
  const auto [same_losses, same_before, same_after] = run({"--decoupled-lr", "3e-3", "--decoupled-min-lr", "3e-4"}, 4);
  EXPECT_EQ(same_losses, losses);
  EXPECT_EQ(same_after, after);

  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed optimizer" : "AdamW");
    const std::vector<std::string> optimizer =
        distributed ? std::vector<std::string>{"--use-distributed-optimizer"} : std::vector<std::string>{};
    std::vector<std::string> doubled_flags = optimizer;
    doubled_flags.insert(doubled_flags.end(), {"--decoupled-lr", "6e-3"});
    const auto [one, before1, after1] = run(optimizer, 1);
    const auto [doubled, before2, after2] = run(doubled_flags, 1);
    int decoupled = 0;
    for (const auto& [name, values] : after1) {
      SCOPED_TRACE(name);
      if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") {
        ++decoupled;
        const std::vector<double>& start = before1.at(name);
        const std::vector<double>& moved = after2.at(name);
        double largest = 0;
        for (size_t i = 0; i < values.size(); ++i) largest = std::max(largest, std::abs(values[i] - start[i]));
        ASSERT_GT(largest, 1e-4);
        for (size_t i = 0; i < values.size(); ++i)
          ASSERT_NEAR(moved[i] - start[i], 2 * (values[i] - start[i]), 1e-5 * largest) << "element " << i;
      } else {
        EXPECT_EQ(after2.at(name), values);
      }
    }
    EXPECT_EQ(decoupled, 2);
  }

  // A floor above the peak: --decoupled-lr under --min-lr 3e-4, with no --decoupled-min-lr.
  testing::expect_error([&] { args(1, {"--decoupled-lr", "1e-4"}); },
                        {"--min-lr (the floor without --decoupled-min-lr) 0.0003", "must not exceed --decoupled-lr 0.0001"});
}

// ---- GPU (run on the GPU machine) ----

// --deterministic-mode: two bf16 runs on the GPU give bit-identical losses at every iteration (the attention
// backward is the one kernel that needs a deterministic variant; the rest is deterministic by construction).
TEST(TrainingGpu, DeterministicModeGivesIdenticalLosses) {
  MEGATRON_REQUIRE_GPU();
  train::Arguments a = tiny_args(12);
  a.training.bf16 = true;
  a.training.deterministic_mode = true;
  const TrainRun first = train_run(a, Device::cuda(0), DType::BF16);
  const TrainRun second = train_run(a, Device::cuda(0), DType::BF16);
  ASSERT_EQ(first.losses.size(), second.losses.size());
  for (size_t i = 0; i < first.losses.size(); ++i)
    EXPECT_EQ(first.losses[i], second.losses[i]) << "iteration " << i + 1;
  EXPECT_LT(first.losses.back(), first.losses.front() - 0.3) << "and it trains";
}

// --fp16: dynamic loss scaling starts at 2^32, skips the iterations whose fp16 gradients overflow (backing
// the scale off after the hysteresis), then trains; the loss falls like the fp32 run's.
TEST(TrainingGpu, Fp16WithDynamicLossScalingSkipsOverflowsThenTrains) {
  MEGATRON_REQUIRE_GPU();
  train::Arguments a = tiny_args(60);
  a.training.fp16 = true;
  train::resolve_and_validate(a);
  double valid = 0;
  const TrainRun run = train_run(a, Device::cuda(0), DType::F16, &valid);
  int skipped = 0;
  for (bool s : run.skipped) skipped += s;
  EXPECT_GT(skipped, 0) << "an initial scale of 2^32 must overflow fp16 gradients";
  EXPECT_LT(skipped, 40);
  EXPECT_LT(run.loss_scales.back(), 4294967296.0);
  for (size_t i = 1; i < run.skipped.size(); ++i) {
    if (run.skipped[i]) {
      EXPECT_LE(run.loss_scales[i], run.loss_scales[i - 1]) << "a skip never raises the scale";
    }
  }
  double last = 0;
  for (size_t i = run.losses.size() - 5; i < run.losses.size(); ++i) last += run.losses[i] / 5;
  EXPECT_LT(last, 7.5) << "mean fp16 training loss of the last 5 iterations (ln V = 8.32)";
  EXPECT_LT(valid, 7.5);
}

}  // namespace
}  // namespace megatron::trainer

namespace megatron::trainer {
namespace {

// Two small indexed datasets with disjoint token ranges, blended 0.75 / 0.25: the training stream draws
// samples from both in that proportion (Megatron's greedy blending), and the weights-free form weighs
// the components by their sizes.
std::string write_dataset(const std::filesystem::path& dir, const std::string& name, int32_t first_token, int docs) {
  std::string prefix = (dir / name).string();
  data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40 + d % 7; ++i) tokens.push_back(first_token + (d * 13 + i) % 100);
    writer.add_document(std::span<const int32_t>(tokens));
  }
  writer.finalize();
  return prefix;
}

TEST(TrainingData, BlendsDataPathsByWeight) {
  std::filesystem::path dir = testing::make_temp_dir("blend_training");
  std::string a = write_dataset(dir, "a", 0, 300), b = write_dataset(dir, "b", 1000, 300);
  train::Arguments args = train::parse_arguments(
      {"--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
       "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "50", "--lr", "1e-3", "--data-path",
       "0.75", a, "0.25", b, "--split", "90,5,5", "--eval-interval", "10", "--eval-iters", "2", "--vocab-size", "2000",
       "--data-cache-path", (dir / "cache").string()});
  args.parallel.world_size = 1;
  train::resolve_and_validate(args);
  TrainingData data(args, 1999);
  SampleStream train = data.stream(data::Split::train);
  ASSERT_TRUE(train.available());
  EXPECT_GE(train.size(), 400);  // sum(ceil(400 * w))
  CpuAllocator host;
  Tensor samples = train.next(400, host);
  int from_a = 0;
  for (int64_t s = 0; s < 400; ++s) from_a += samples.data<int64_t>()[s * 17] < 1000;
  EXPECT_EQ(from_a, 300) << "greedy blending gives exactly 75% of the first 400 samples to A";
  EXPECT_EQ(train.consumed(), 400);
  EXPECT_TRUE(data.stream(data::Split::valid).available());
  EXPECT_TRUE(data.stream(data::Split::test).available());
  EXPECT_NE(data.describe().find("blended from"), std::string::npos) << data.describe();

  testing::expect_error([&] { parse_data_path({"0.5", "a", "b"}); }, {"--data-path"});
  testing::expect_error([&] { parse_data_path({"a", "0.5"}); }, {"--data-path", "looks like a weight"});
  auto [weights, prefixes] = parse_data_path({"x", "y"});
  EXPECT_TRUE(weights.empty());
  EXPECT_EQ(prefixes.size(), 2u);
}

}  // namespace
}  // namespace megatron::trainer
