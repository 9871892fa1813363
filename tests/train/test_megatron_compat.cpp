// Megatron-LM's flags that arrive with its example scripts and guides: sample-based training and schedules
// (checked against Megatron's formulas, written out here), the batch-size ramp-up and step schedule
// (num_microbatches_calculator.py's arithmetic and update_train_iters), weight-decay schedules, the documented
// no-ops, the refusals with their reasons, the guides' aliases and --yaml-cfg in Megatron's YAML format.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "harness.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/train/batch_size_schedule.h"
#include "megatron/train/flags.h"
#include "megatron/train/logging_arguments.h"
#include "megatron/train/yaml_config.h"

namespace megatron::train {
namespace {

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "64", "--mock-data", "--vocab-size", "4096", "--lr", "1e-3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

Arguments resolved(std::vector<std::string> extra) {
  Arguments a = parse_arguments(tiny(std::move(extra)));
  resolve_and_validate(a);
  return a;
}

TEST(BatchSizeRampup, MegatronsIncrementsAndIterations) {
  // Megatron: num_increments = (GBS - start) / incr; samples per increment = ramp / num_increments (a float);
  // batch = GBS once consumed > ramp, else start + int(consumed / per_increment) * incr.
  const BatchSizeSchedule s = BatchSizeSchedule::rampup(16, 16, 5859375, 1536);
  const double per_increment = 5859375.0 / 95.0;
  for (int64_t c : {int64_t(0), int64_t(61677), int64_t(61678), int64_t(3000000), int64_t(5859375), int64_t(5859376)}) {
    const int64_t expected = c > 5859375 ? 1536 : 16 + int64_t(double(c) / per_increment) * 16;
    EXPECT_EQ(s.global_batch_size(c), expected) << "after " << c << " samples";
  }
  EXPECT_EQ(s.global_batch_size(61678), 32);
  EXPECT_EQ(s.sizes().size(), 96u);
  // update_train_iters by hand for 2 1 4 and GBS 4: batches 2 (0 -> 2), 3 (2 -> 5), then 4 while 14 samples
  // last: 5 -> 9 -> 13, the partial last batch thrown away.
  EXPECT_EQ(BatchSizeSchedule::rampup(2, 1, 4, 4).train_iters(14), 4);
  testing::expect_error([] { BatchSizeSchedule::rampup(16, 10, 100, 64); }, {"--rampup-batch-size", "multiple of the increment"});
}

TEST(BatchSizeStepSchedule, ThresholdsAreTokensWithSuffixes) {
  // "2.4B" tokens = int(2.4 * 1e9) // seq 2048 = 1171875 samples.
  const BatchSizeSchedule s = BatchSizeSchedule::step("0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", 2048);
  EXPECT_EQ(s.steps()[1], (std::pair<int64_t, int64_t>{1171875, 320}));
  EXPECT_EQ(s.global_batch_size(1171874), 16);
  EXPECT_EQ(s.global_batch_size(1171875), 320);
  EXPECT_EQ(s.global_batch_size(int64_t(12e9) / 2048), 1536);
  // Commas separate too; entries are sorted; the iterations run until the samples are reached.
  const BatchSizeSchedule t = BatchSizeSchedule::step("256:4,0:2", 64);  // 256 tokens = 4 samples
  EXPECT_EQ(t.train_iters(14), 5);  // 0 -> 2 -> 4 -> 8 -> 12 -> 16
  testing::expect_error([] { BatchSizeSchedule::step("1k:8", 64); }, {"first threshold must be 0"});
  testing::expect_error([] { BatchSizeSchedule::step("0:8 64:16 100:32", 64); }, {"strictly increasing"});
  testing::expect_error([] { BatchSizeSchedule::step("0:8 x:16", 64); }, {"'x:16'"});
}

TEST(SampleBasedTraining, IterationsAndScheduleInSamples) {
  const Arguments a = resolved({"--micro-batch-size", "2", "--global-batch-size", "8", "--train-samples", "100",
                                "--lr-decay-samples", "80", "--lr-warmup-samples", "20", "--lr-decay-style", "cosine",
                                "--lr-warmup-init", "1e-4"});
  EXPECT_EQ(a.training.train_iters, 12);  // 100 // 8
  const optim::ParamSchedule s = optim::schedule_from_arguments(a.training);
  EXPECT_EQ(s.decay_steps, 80);
  EXPECT_EQ(s.warmup_steps, 20.0);
  EXPECT_EQ(s.init_lr, 1e-4);
  optim::OptimizerParamScheduler sched(s);
  sched.step(8);  // one iteration of 8 samples into the warmup: init + (max - init) * 8 / 20
  EXPECT_DOUBLE_EQ(sched.lr(), 1e-4 + (1e-3 - 1e-4) * 8.0 / 20.0);
  sched.step(40);  // 48 samples: cosine over (48 - 20) / (80 - 20)
  EXPECT_DOUBLE_EQ(sched.lr(), 0.5 * (std::cos(std::numbers::pi * 28.0 / 60.0) + 1.0) * 1e-3);
  // --lr-warmup-fraction: warmup = fraction x decay, a real number of samples.
  const Arguments f = resolved({"--global-batch-size", "4", "--train-iters", "10", "--lr-warmup-fraction", "0.15"});
  EXPECT_DOUBLE_EQ(optim::schedule_from_arguments(f.training).warmup_steps, 0.15 * 40);
}

TEST(WeightDecaySchedule, MegatronsLinearAndCosineIncrements) {
  const Arguments a = resolved({"--train-iters", "10", "--weight-decay-incr-style", "cosine", "--start-weight-decay",
                                "0.01", "--end-weight-decay", "0.1"});
  optim::OptimizerParamScheduler sched(optim::schedule_from_arguments(a.training));
  sched.step(3);  // r = 3 / 10: start + (end - start) * 0.5 * (cos(pi * (1 - r)) + 1)
  EXPECT_DOUBLE_EQ(sched.weight_decay(), 0.01 + 0.09 * 0.5 * (std::cos(std::numbers::pi * 0.7) + 1.0));
  const Arguments l = resolved({"--train-iters", "10", "--weight-decay-incr-style", "linear", "--start-weight-decay",
                                "0", "--end-weight-decay", "0.2"});
  optim::OptimizerParamScheduler lin(optim::schedule_from_arguments(l.training));
  lin.step(4);
  EXPECT_DOUBLE_EQ(lin.weight_decay(), 0.2 * 0.4);
}

TEST(ScheduleRules, MegatronsAssertsAsSentences) {
  testing::expect_error([] { resolved({"--train-iters", "10", "--global-batch-size", "4", "--rampup-batch-size", "2", "1", "4"}); },
                        {"--rampup-batch-size needs sample-based training"});
  testing::expect_error([] { resolved({"--train-samples", "40", "--global-batch-size", "4", "--step-batch-size-schedule", "0:2"}); },
                        {"cannot specify both --step-batch-size-schedule and --global-batch-size"});
  testing::expect_error([] { resolved({"--train-samples", "40", "--lr-decay-iters", "5"}); }, {"--lr-decay-iters needs --train-iters"});
  testing::expect_error([] { resolved({"--train-iters", "5", "--train-samples", "40"}); }, {"mutually exclusive"});
  testing::expect_error([] { resolved({"--train-iters", "5", "--start-weight-decay", "0.1"}); }, {"linear or cosine"});
  testing::expect_error([] { resolved({"--train-iters", "5", "--weight-decay-incr-style", "linear"}); },
                        {"needs --start-weight-decay and --end-weight-decay"});
  testing::expect_error([] { resolved({"--train-samples", "40", "--micro-batch-size", "2", "--rampup-batch-size", "3", "1", "8",
                                       "--global-batch-size", "4"}); },
                        {"global batch of 3", "not a multiple"});
  // A step schedule with --train-samples resolves: the iterations follow the schedule.
  EXPECT_EQ(resolved({"--train-samples", "14", "--step-batch-size-schedule", "0:2 256:4"}).training.train_iters, 5);
}

TEST(CompatFlags, NoOpsAreAcceptedAndRefusalsNameWhatToUse) {
  const Arguments ok = resolved({"--train-iters", "3", "--use-flash-attn", "--transformer-impl", "transformer_engine",
                                 "--no-gradient-accumulation-fusion", "--num-workers", "8", "--ckpt-format", "torch_dist",
                                 "--use-mcore-models", "--attention-backend", "fused", "--fp8", "hybrid"});
  EXPECT_EQ(ok.fp8.fp8_format, "hybrid") << "--fp8 is the guides' spelling of --fp8-format";
  testing::expect_error([] { parse_arguments(tiny({"--transformer-impl", "te"})); }, {"--transformer-impl 'te'", "local"});
  testing::expect_error([] { resolved({"--train-iters", "3", "--wandb-project", "p", "--ckpt-format", "torch",
                                       "--dynamic-context-parallel", "--position-embedding-type", "learned_absolute",
                                       "--no-position-embedding"}); },
                        {"--wandb-project p: Weights & Biases has no maintained C++ writer", "--tensorboard-dir DIR", "--ckpt-format torch:",
                         "use --ckpt-format torch_dist", "--hybrid-context-parallel needs a power-of-two",
                         "--no-position-embedding is deprecated"});
  bool found_refused = false, found_noop = false;
  for (const FlagStatusRow& row : flag_statuses()) {
    found_refused = found_refused || (row.name == "--wandb-project" && row.status == "refused");
    found_noop = found_noop || (row.name == "--use-flash-attn" && row.status == "no-op" && !row.reason.empty());
  }
  EXPECT_TRUE(found_refused && found_noop);
}

TEST(ProfilingFlags, PyTorchProfilerTracesGoWhereMegatronPutsThem) {
  const auto trace_dir = [](std::vector<std::string> extra) { return profile_trace_dir(parse_arguments(tiny(std::move(extra)))); };
  EXPECT_EQ(trace_dir({"--profile", "--use-pytorch-profiler", "--tensorboard-dir", "/runs/a/tb"}), "/runs/a/torch_profile");
  EXPECT_EQ(trace_dir({"--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb", "--profile-dir", "p"}), "p");
  EXPECT_EQ(trace_dir({"--profile", "--profile-dir", "p"}), "p");
  EXPECT_EQ(trace_dir({"--profile", "--tensorboard-dir", "tb"}), "") << "no kernel trace asked for, no span trace";
  EXPECT_EQ(trace_dir({"--use-pytorch-profiler", "--profile-dir", "p"}), "") << "Megatron profiles only with --profile";
  testing::expect_error([] { resolved({"--train-iters", "3", "--profile", "--use-pytorch-profiler"}); },
                        {"--use-pytorch-profiler writes its trace to --profile-dir", "--tensorboard-dir"});
  // The profiler's companions in Megatron's scripts: shapes and call stacks are moot, Chakra traces refused.
  EXPECT_TRUE(resolved({"--train-iters", "3", "--profile", "--use-pytorch-profiler", "--profile-dir", "p",
                        "--pytorch-profiler-collect-shapes", "--pytorch-profiler-collect-callstack"}).training.profile);
  testing::expect_error([] { resolved({"--train-iters", "3", "--pytorch-profiler-collect-chakra"}); },
                        {"--pytorch-profiler-collect-chakra", "no Chakra execution-trace writer"});
  EXPECT_TRUE(resolved({"--train-iters", "3", "--use-pytorch-profiler"}).training.use_pytorch_profiler);
}

TEST(YamlConfig, MegatronsFormatBecomesFlags) {
  if (!yaml_config_available()) GTEST_SKIP() << "built without yaml-cpp";
  const std::filesystem::path dir = testing::make_temp_dir("yaml_cfg");
  setenv("MEGATRON_TEST_DATA_CACHE", (dir / "cache").c_str(), 1);
  std::ofstream(dir / "gpt.yaml") << R"(# Megatron-LM's YAML arguments (yaml_arguments.py)
language_model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  num_query_groups: null
  layernorm_epsilon: 1.e-6
  add_bias_linear: False
  activation_func: swiglu
  gated_linear_unit: True
  bias_swiglu_fusion: True
  masked_softmax_fusion: False
  apply_rope_fusion: True
  attention_dropout: 0.0
  normalization: "RMSNorm"
model_parallel:
  tensor_model_parallel_size: 1
  bf16: True
  gradient_accumulation_fusion: True
  batch_p2p_comm: True
micro_batch_size: 2
global_batch_size: 8
train_samples: 80
lr: 2.5e-4
lr_decay_style: cosine
lr_warmup_samples: 16
position_embedding_type: rope
add_position_embedding: False
mock_data: True
vocab_size: 4096
seq_length: 64
data_cache_path: ${MEGATRON_TEST_DATA_CACHE}
profile_ranks: [0]
wandb_project: ''
tensorboard_dir: null
sgd_momentum: 0.9
)";
  Arguments a = parse_arguments({"--yaml-cfg", (dir / "gpt.yaml").string()});
  resolve_and_validate(a);
  EXPECT_EQ(a.model.num_layers, 2);
  EXPECT_DOUBLE_EQ(a.model.norm_epsilon, 1e-6);
  EXPECT_TRUE(a.model.disable_bias_linear);
  EXPECT_TRUE(a.model.swiglu);
  EXPECT_EQ(a.model.normalization, "RMSNorm");
  EXPECT_TRUE(a.training.bf16);
  EXPECT_EQ(a.training.train_iters, 10);
  EXPECT_EQ(a.data.data_cache_path, (dir / "cache").string());
  EXPECT_EQ(a.training.profile_ranks, std::vector<int>{0});
  // Hybrid context parallelism as Megatron's YAML (TransformerConfig) spells it.
  std::ofstream(dir / "hybrid.yaml") << "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 64\n"
                                        "micro_batch_size: 1\nglobal_batch_size: 8\ntrain_iters: 2\nmock_data: True\n"
                                        "vocab_size: 4096\nlr: 1.0e-4\nmodel_parallel:\n  context_parallel_size: 4\n"
                                        "  hybrid_context_parallel: True\n  max_seqlen_per_dp_cp_rank: 16\n"
                                        "calculate_per_token_loss: True\nreset_attention_mask: True\n";
  Arguments hybrid = parse_arguments({"--yaml-cfg", (dir / "hybrid.yaml").string()});
  hybrid.parallel.world_size = 4;
  resolve_and_validate(hybrid);
  EXPECT_TRUE(hybrid.parallel.hybrid_context_parallel);
  EXPECT_EQ(hybrid.parallel.max_seqlen_per_dp_cp_rank, 16);

  std::ofstream(dir / "bad.yaml") << "num_layers: 2\nfancy_new_setting: 7\nlanguage_model:\n  squared_relu: True\n";
  testing::expect_error([&] { parse_arguments({"--yaml-cfg", (dir / "bad.yaml").string()}); },
                        {"2 key(s)", "fancy_new_setting: 7", "squared_relu: true"});
  testing::expect_error([&] { parse_arguments({"--yaml-cfg", (dir / "gpt.yaml").string(), "--lr", "1"}); },
                        {"replaces the whole command line", "--lr"});
  // A directory (which yaml-cpp's reader would end the process on, as the fuzzer found) and a missing file.
  testing::expect_error([&] { parse_arguments({"--yaml-cfg", dir.string()}); }, {dir.string(), "not a regular file"});
  testing::expect_error([&] { parse_arguments({"--yaml-cfg", (dir / "none.yaml").string()}); }, {"no such file"});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megatron::train
