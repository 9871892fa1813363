// Megatron's command line: parsing, nearest-flag suggestions, derived defaults, every violated constraint
// reported at once, vocabulary padding, and the FLOPs formula against an independent count.
#include <gtest/gtest.h>

#include <random>

#include "harness.h"
#include "megatron/train/flags.h"
#include "megatron/train/flops.h"
#include "megatron/train/fp8_arguments.h"
#include "megatron/train/model_config.h"
#include "megatron/train/moe_arguments.h"
#include "megatron/train/recompute_arguments.h"

namespace megatron::train {
namespace {

using ::megatron::testing::expect_error;

std::vector<std::string> gpt2_small() {
  return {"--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
          "--max-position-embeddings", "1024", "--micro-batch-size", "8", "--global-batch-size", "64",
          "--train-iters", "100", "--lr", "6.0e-4", "--min-lr=6e-5", "--lr-decay-style", "cosine", "--bf16",
          "--mock-data", "--vocab-size", "50257", "--data-path"};
}

TEST(Flags, ParsesMegatronFlagsAndResolvesDefaults) {
  std::vector<std::string> argv = gpt2_small();
  argv.pop_back();  // no --data-path with --mock-data
  Arguments a = parse_arguments(argv);
  resolve_and_validate(a);
  EXPECT_EQ(a.model.hidden_size, 768);
  EXPECT_DOUBLE_EQ(a.training.lr, 6e-4);
  EXPECT_DOUBLE_EQ(a.training.min_lr, 6e-5);
  EXPECT_TRUE(a.training.bf16);
  EXPECT_EQ(a.model.ffn_hidden_size, 4 * 768);
  EXPECT_EQ(a.model.kv_channels, 64);
  EXPECT_EQ(a.model.num_query_groups, 12);
  EXPECT_EQ(a.training.lr_decay_iters, 100);
  EXPECT_EQ(a.padded_vocab_size(), 50304);  // 50257 rounded up to 128
}

TEST(Flags, SwigluDefaultFfnAndGqa) {
  Arguments a = parse_arguments({"--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16",
                                 "--num-query-groups", "8", "--swiglu", "--seq-length", "2048", "--train-iters", "10",
                                 "--lr", "3e-4", "--mock-data", "--vocab-size", "32000"});
  resolve_and_validate(a);
  EXPECT_EQ(a.model.ffn_hidden_size, 5440);  // int(4 * 2048 * 2 / 3 / 64) * 64, Megatron's rule
  EXPECT_EQ(a.model.num_query_groups, 8);
  a.parallel.tensor_model_parallel_size = 4;
  a.parallel.world_size = 4;
  EXPECT_EQ(a.padded_vocab_size(), 32256);  // multiple of 128 * TP = 512
}

// Attention dropout keeps Megatron's default 0.1; who draws its masks on GPUs reaches the model's configuration
// and comes back from it (checkpoint metadata), and only the two generators are accepted.
TEST(Flags, AttentionDropoutMasks) {
  std::vector<std::string> argv = gpt2_small();
  argv.pop_back();
  Arguments a = parse_arguments(argv);
  resolve_and_validate(a);
  EXPECT_DOUBLE_EQ(a.model.attention_dropout, 0.1);
  EXPECT_FALSE(train::transformer_config(a, 1).attention_dropout_by_index);
  argv.insert(argv.end(), {"--attention-dropout-masks", "by-index"});
  Arguments b = parse_arguments(argv);
  resolve_and_validate(b);
  const nn::TransformerConfig config = train::transformer_config(b, 1);
  EXPECT_TRUE(config.attention_dropout_by_index);
  EXPECT_EQ(train::model_arguments(config).attention_dropout_masks, "by-index");
  expect_error([] { parse_arguments({"--attention-dropout-masks", "cudnn"}); },
               {"--attention-dropout-masks 'cudnn' is not one of {device, by-index}"});
}

TEST(Flags, UnknownFlagSuggestsTheNearestAndAllProblemsAreListed) {
  expect_error([] { parse_arguments({"--hiden-size", "768", "--num-layers", "x", "--lr-decay-style", "cosin"}); },
               {"3 problems", "unknown flag --hiden-size; did you mean --hidden-size?",
                "--num-layers expects an integer, got 'x'", "--lr-decay-style 'cosin' is not one of {constant, linear, cosine"});
  expect_error([] { parse_arguments({"--bf16=yes"}); }, {"--bf16 is a switch"});
  expect_error([] { parse_arguments({"--lr"}); }, {"--lr needs a value"});
  EXPECT_EQ(nearest_flag("--tensor-parallel-size"), "--tensor-model-parallel-size");
  EXPECT_EQ(nearest_flag("--completely-different-thing-here"), "");
}

// nearest_flag prunes with lower bounds (length difference, byte histograms) so that a long argument costs
// little; its answer must stay the plain search's: the first flag at the smallest distance within the limit.
TEST(Flags, NearestFlagEqualsThePlainSearch) {
  const std::vector<FlagStatusRow> flags = flag_statuses();
  const auto plain = [&](const std::string& unknown) {
    std::string best;
    size_t best_distance = SIZE_MAX;
    for (const FlagStatusRow& f : flags)
      if (const size_t d = edit_distance(unknown, f.name); d < best_distance) best_distance = d, best = f.name;
    return best_distance <= std::max<size_t>(3, unknown.size() / 3) ? best : "";
  };
  std::mt19937 random(5);
  for (int c = 0; c < 400; ++c) {
    std::string s = flags[random() % flags.size()].name;
    for (int edits = int(random() % 8); edits > 0 && !s.empty(); --edits) {
      const size_t at = random() % s.size();
      const char ch = char('a' + random() % 27);  // '{' stands for a byte no flag has
      if (random() % 3 == 0) s.erase(at, 1);
      else if (random() % 2 == 0) s.insert(at, 1, ch);
      else s[at] = ch;
    }
    EXPECT_EQ(nearest_flag(s), plain(s)) << s;
  }
  const std::string huge = "--hidden-size" + std::string(200000, 'x');  // must not cost |a| x |b| per flag
  EXPECT_EQ(nearest_flag(huge), "");
}

TEST(Flags, DataPathTakesWeightsAndPrefixes) {
  Arguments a = parse_arguments({"--data-path", "0.7", "a/x_text_document", "0.3", "b/y_text_document", "--split", "98,2,0"});
  ASSERT_EQ(a.data.data_path.size(), 4u);
  EXPECT_EQ(a.data.data_path[1], "a/x_text_document");
  EXPECT_EQ(a.data.split, "98,2,0");
}

TEST(Validate, EveryViolatedConstraintAtOnce) {
  Arguments a = parse_arguments({"--num-layers", "10", "--hidden-size", "1000", "--num-attention-heads", "12",
                                 "--seq-length", "1023", "--train-iters", "5", "--lr", "1e-4", "--min-lr", "1e-3",
                                 "--bf16", "--fp16", "--tensor-model-parallel-size", "8",
                                 "--pipeline-model-parallel-size", "3", "--sequence-parallel", "--micro-batch-size", "3",
                                 "--global-batch-size", "10", "--mock-data", "--vocab-size", "100"});
  a.parallel.world_size = 48;
  resolve(a);
  std::vector<std::string> v = constraint_violations(a);
  auto has = [&](const std::string& s) {
    for (const auto& x : v)
      if (x.find(s) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("--hidden-size 1000 must be divisible by --num-attention-heads 12"));
  EXPECT_TRUE(has("--min-lr 0.001 must not exceed --lr 0.0001"));
  EXPECT_TRUE(has("--bf16 and --fp16 are mutually exclusive"));
  EXPECT_TRUE(has("--num-attention-heads 12 must be divisible by --tensor-model-parallel-size 8"));
  EXPECT_TRUE(has("--num-layers 10 must be divisible by --pipeline-model-parallel-size 3"));
  EXPECT_TRUE(has("--seq-length 1023 must be divisible by --tensor-model-parallel-size 8 with --sequence-parallel"));
  EXPECT_TRUE(has("--global-batch-size 10 must be divisible by --micro-batch-size 3 x data-parallel size 2 = 6"));
  EXPECT_GE(v.size(), 7u);
  expect_error([&] { resolve_and_validate(a); }, {"invalid configuration", "problems", "--bf16 and --fp16"});
}

// --ckpt-step names an iteration of --load: it needs --load, is not negative, and does not mix with
// --load-fallback-to-intact (which picks the iteration itself).
TEST(Validate, CkptStepNeedsLoadAndNoFallback) {
  const auto violations = [](std::vector<std::string> extra) {
    std::vector<std::string> argv = gpt2_small();
    argv.pop_back();
    argv.insert(argv.end(), extra.begin(), extra.end());
    Arguments a = parse_arguments(argv);
    a.parallel.world_size = 8;
    resolve(a);
    std::string all;
    for (const std::string& v : constraint_violations(a)) all += v + "\n";
    return all;
  };
  EXPECT_EQ(violations({"--load", "ckpt", "--ckpt-step", "4"}), "");
  EXPECT_NE(violations({"--ckpt-step", "4"}).find("--ckpt-step 4 needs --load"), std::string::npos);
  EXPECT_NE(violations({"--load", "ckpt", "--ckpt-step", "-1"}).find("--ckpt-step must not be negative"), std::string::npos);
  EXPECT_NE(violations({"--load", "ckpt", "--ckpt-step", "4", "--load-fallback-to-intact"}).find("give one of the two"),
            std::string::npos);
}

TEST(Validate, ValidConfigurationHasNoViolations) {
  std::vector<std::string> argv = gpt2_small();
  argv.pop_back();
  Arguments a = parse_arguments(argv);
  a.parallel.world_size = 8;
  resolve(a);
  EXPECT_TRUE(constraint_violations(a).empty());
  std::string d = describe_arguments(a);
  EXPECT_NE(d.find("hidden_size"), std::string::npos);
  EXPECT_NE(d.find("data_parallel_size"), std::string::npos);
}

// Independent count: 2 FLOPs per multiply-add of every weight matrix per token, x3 for forward+backward, plus
// attention's two batched products (QK^T and PV) with the causal half counted.
double flops_by_layer_shapes(const Arguments& a, int64_t batch) {
  const ModelArguments& m = a.model;
  double tokens = double(batch) * m.seq_length;
  double q = double(m.hidden_size) * m.num_attention_heads * m.kv_channels;
  double kv = 2.0 * m.hidden_size * m.num_query_groups * m.kv_channels;
  double proj = double(m.num_attention_heads) * m.kv_channels * m.hidden_size;
  double mlp_in = double(m.hidden_size) * m.ffn_hidden_size * (m.swiglu ? 2 : 1);
  double mlp_out = double(m.ffn_hidden_size) * m.hidden_size;
  double per_layer_weights = q + kv + proj + mlp_in + mlp_out;
  double logits = double(m.hidden_size) * a.padded_vocab_size();
  double matmul = 3 * 2 * tokens * (m.num_layers * per_layer_weights + logits);
  double attention = 3 * 2 * 2 * double(batch) * m.num_attention_heads * double(m.seq_length) * m.seq_length *
                     m.kv_channels * m.num_layers / 2;
  return matmul + attention;
}

// Pipeline flags: the virtual size from any of its three spellings, the micro-batch group default, and every
// rule Megatron enforces (plus the split that must place every layer).
Arguments pipeline_args(int world, std::vector<std::string> extra) {
  std::vector<std::string> argv = gpt2_small();
  argv.pop_back();
  argv.insert(argv.end(), extra.begin(), extra.end());
  Arguments a = parse_arguments(argv);
  a.parallel.world_size = world;
  return a;
}

TEST(Validate, PipelineFlagsResolveAndEveryPipelineRuleIsChecked) {
  Arguments a = pipeline_args(4, {"--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"});
  resolve_and_validate(a);
  EXPECT_EQ(a.parallel.virtual_pipeline_size, 3);  // 12 layers / 4 stages / 1 per chunk
  EXPECT_EQ(a.parallel.microbatch_group_size_per_virtual_pipeline_stage, 4);
  for (const char* flag : {"--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"}) {
    Arguments b = pipeline_args(2, {"--pipeline-model-parallel-size", "2", flag, "2"});
    resolve_and_validate(b);
    EXPECT_EQ(b.parallel.virtual_pipeline_size, 2) << flag;
  }
  // 8 micro-batches per iteration (GBS 64 / MBS 8): interleaving at PP 3 would leave a last group of 2 < 3.
  expect_error([] { Arguments c = pipeline_args(3, {"--pipeline-model-parallel-size", "3", "--virtual-pipeline-model-parallel-size", "2"});
                    resolve_and_validate(c); },
               {"last group of 2", "multiple of 3"});
  expect_error([] { Arguments c = pipeline_args(1, {"--virtual-pipeline-model-parallel-size", "2"}); resolve_and_validate(c); },
               {"needs --pipeline-model-parallel-size > 1"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
                                                    "--num-layers-per-virtual-pipeline-stage", "3"});
                    resolve_and_validate(c); },
               {"at most one of --num-layers-per-virtual-pipeline-stage"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "4",
                                                    "--num-layers-per-virtual-pipeline-stage", "2"});
                    resolve_and_validate(c); },
               {"not --num-layers-per-virtual-pipeline-stage"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "6",
                                                    "--decoder-last-pipeline-num-layers", "4"});
                    resolve_and_validate(c); },
               {"places 10 of the 12 layers"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
                                                    "--microbatch-group-size-per-virtual-pipeline-stage", "9"});
                    resolve_and_validate(c); },
               {"--microbatch-group-size-per-virtual-pipeline-stage 9 must be in [pipeline size 2, micro-batches per iteration 8]"});
  expect_error([] { Arguments c = pipeline_args(5, {"--pipeline-model-parallel-size", "5"}); resolve_and_validate(c); },
               {"--num-layers 12 must be divisible by --pipeline-model-parallel-size 5"});
  // --pipeline-model-parallel-layout sets the interleaving itself (4 stages over PP 2: 2 chunks per rank).
  Arguments d = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*4|t*3|t*3|t*2L"});
  resolve_and_validate(d);
  EXPECT_EQ(d.parallel.virtual_pipeline_size, 2);
  EXPECT_EQ(parallel::describe(parallel::split_layers(pipeline_split_config(d))), "rank 0: [0, 4) [7, 10); rank 1: [4, 7) [10, 12)");
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                                    "Et*6|t*6L", "--virtual-pipeline-model-parallel-size", "2"});
                    resolve_and_validate(c); },
               {"at most one of", "--pipeline-model-parallel-layout (the layout sets the interleaving itself)"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                                    "Et*6|t*5L"});
                    resolve_and_validate(c); },
               {"places 11 transformer layers ('t') but --num-layers is 12"});
  expect_error([] { Arguments c = pipeline_args(2, {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                                    "Et*6|t*6Q"});
                    resolve_and_validate(c); },
               {"unknown character 'Q'"});
}

// Context-parallel flags: the types (one, or one per layer; both spellings of all_gather), the hierarchical
// sizes a2a+p2p needs (refused without them: Megatron Bridge silently ran such a job without CP), the heads
// the all-to-all splits, and the sequence's divisibility.
TEST(Validate, SftRefusesWhatItCannotDoYet) {
  Arguments ok = pipeline_args(1, {"--sft", "--tokenizer-type", "SFTTokenizer", "--tokenizer-model", "t"});
  ok.data.mock_data = false;
  ok.data.data_path = {"c.jsonl"};
  ok.training.device = "cpu";
  EXPECT_NO_THROW(resolve_and_validate(ok));
  Arguments bad = pipeline_args(2, {"--sft", "--pipeline-model-parallel-size", "2", "--device", "cuda"});
  expect_error([&] { resolve_and_validate(bad); },
               {"--sft packs conversations", "--pipeline-model-parallel-size 1", "--data-path FILE.jsonl",
                "--tokenizer-type (SFTTokenizer"});
  ok.training.device = "cuda";  // the packed attention runs on cuDNN's ragged offsets
  EXPECT_NO_THROW(resolve_and_validate(ok));
}

// Hybrid context parallelism: Megatron's requirements (per-token loss, no pipeline) and ours (packed documents, a
// power-of-two CP size, a token budget), all reported at once; the budget alone is refused without the mode.
TEST(Validate, HybridContextParallelRulesAreChecked) {
  Arguments ok = pipeline_args(4, {"--context-parallel-size", "4", "--hybrid-context-parallel",
                                   "--max-seqlen-per-dp-cp-rank", "256", "--calculate-per-token-loss",
                                   "--reset-attention-mask"});
  EXPECT_NO_THROW(resolve_and_validate(ok));
  EXPECT_TRUE(ok.parallel.hybrid_context_parallel);
  EXPECT_EQ(ok.parallel.max_seqlen_per_dp_cp_rank, 256);
  Arguments alias = pipeline_args(4, {"--context-parallel-size", "4", "--dynamic-context-parallel",
                                      "--max-seqlen-per-dp-cp-rank", "256", "--calculate-per-token-loss",
                                      "--reset-attention-mask"});
  EXPECT_NO_THROW(resolve_and_validate(alias));
  EXPECT_TRUE(alias.parallel.hybrid_context_parallel);
  Arguments bad = pipeline_args(6, {"--context-parallel-size", "3", "--hybrid-context-parallel",
                                    "--pipeline-model-parallel-size", "2"});
  expect_error([&] { resolve_and_validate(bad); },
               {"power-of-two --context-parallel-size above 1, got 3", "--max-seqlen-per-dp-cp-rank N > 0",
                "needs --calculate-per-token-loss", "packed documents (--reset-attention-mask or --sft)",
                "--pipeline-model-parallel-size > 1 is refused"});
  Arguments budget = pipeline_args(1, {"--max-seqlen-per-dp-cp-rank", "256"});
  expect_error([&] { resolve_and_validate(budget); }, {"--max-seqlen-per-dp-cp-rank needs --hybrid-context-parallel"});
}

TEST(Validate, ContextParallelRulesAreChecked) {
  Arguments a = pipeline_args(8, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                                  "--hierarchical-context-parallel-sizes", "2", "2"});
  resolve_and_validate(a);
  EXPECT_EQ(a.data_parallel_size(), 2);
  EXPECT_EQ(a.parallel.hierarchical_context_parallel_sizes, (std::vector<int>{2, 2}));
  Arguments per_layer = pipeline_args(2, {"--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a", "allgather",
                                          "p2p", "p2p", "p2p", "a2a", "a2a", "p2p", "p2p", "all_gather", "p2p"});
  resolve_and_validate(per_layer);
  EXPECT_EQ(per_layer.parallel.cp_comm_type.size(), 12u);
  expect_error([] { Arguments c = pipeline_args(4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"});
                    resolve_and_validate(c); },
               {"--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes"});
  expect_error([] { Arguments c = pipeline_args(4, {"--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2", "3"});
                    resolve_and_validate(c); },
               {"multiply to --context-parallel-size 4", "product of 6"});
  // The copy-engine transport is the p2p ring's: refused where no layer runs the ring.
  expect_error([] { Arguments c = pipeline_args(4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a",
                                                    "--cp-comm-transport", "copy-engine"});
                    resolve_and_validate(c); },
               {"--cp-comm-transport copy-engine", "--cp-comm-type p2p"});
  expect_error([] { Arguments c = pipeline_args(1, {"--cp-comm-transport", "copy-engine"}); resolve_and_validate(c); },
               {"--context-parallel-size > 1 (got 1)"});
  Arguments ring = pipeline_args(2, {"--context-parallel-size", "2", "--cp-comm-transport", "copy-engine"});
  resolve_and_validate(ring);
  // 12 heads do not split over an all-to-all of 8.
  expect_error([] { Arguments c = pipeline_args(8, {"--context-parallel-size", "8", "--cp-comm-type", "a2a"});
                    resolve_and_validate(c); },
               {"--cp-comm-type a2a splits the 12 attention heads and 12 query groups", "divisible by 8"});
  expect_error([] { Arguments c = pipeline_args(2, {"--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a"});
                    resolve_and_validate(c); },
               {"--cp-comm-type gives 2 types", "one per layer (12)"});
  expect_error([] { Arguments c = pipeline_args(2, {"--context-parallel-size", "2", "--cp-comm-type", "ring"}); },
               {"--cp-comm-type 'ring' is not one of"});
  expect_error([] { Arguments c = pipeline_args(6, {"--context-parallel-size", "3", "--seq-length", "1022",
                                                    "--max-position-embeddings", "1022"});
                    resolve_and_validate(c); },
               {"--seq-length 1022 must be divisible by 2 x --context-parallel-size 3 = 6"});
  expect_error([] { Arguments c = pipeline_args(8, {"--context-parallel-size", "2", "--tensor-model-parallel-size", "4",
                                                    "--sequence-parallel", "--seq-length", "1028", "--max-position-embeddings", "1028"});
                    resolve_and_validate(c); },
               {"--seq-length 1028 must be divisible by --context-parallel-size 2 x --tensor-model-parallel-size 4"});
}

TEST(Flops, MegatronFormulaEqualsAnIndependentCount) {
  for (bool swiglu : {false, true}) {
    Arguments a = parse_arguments({"--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16",
                                   "--num-query-groups", "8", "--seq-length", "2048", "--train-iters", "1", "--lr", "1",
                                   "--mock-data", "--vocab-size", "32000"});
    a.model.swiglu = swiglu;
    a.model.ffn_hidden_size = 5632;
    resolve_and_validate(a);
    double ours = num_floating_point_operations(a, 32);
    double independent = flops_by_layer_shapes(a, 32);
    EXPECT_NEAR(ours / independent, 1.0, 1e-12) << "swiglu " << swiglu;
  }
}

// Packed documents count only their own attention scores: the sum of squared document lengths replaces
// B s^2 in the attention term (6 n d L per squared token), the rest of the formula unchanged.
TEST(Flops, PackedDocumentsCountOnlyTheirOwnAttention) {
  Arguments a = parse_arguments({"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
                                 "--seq-length", "1024", "--train-iters", "1", "--lr", "1", "--mock-data",
                                 "--vocab-size", "32000"});
  resolve_and_validate(a);
  const double whole = num_floating_point_operations(a, 2);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(a, 2, 2.0 * 1024 * 1024), whole);  // one document per row
  const double documents = 2 * (512.0 * 512 + 256.0 * 256 * 2);                       // 3 documents per row
  const double n_d_L = 8.0 * 32 * 4;
  EXPECT_DOUBLE_EQ(whole - num_floating_point_operations(a, 2, documents), 6 * n_d_L * (2.0 * 1024 * 1024 - documents));
}

}  // namespace
}  // namespace megatron::train

namespace megatron::train {
namespace {

TEST(Validate, MoeFlagsResolveAndEveryMoeRuleIsReportedAtOnce) {
  Arguments a = pipeline_args(8, {"--disable-bias-linear", "--num-experts", "8", "--expert-model-parallel-size", "4",
                                  "--moe-router-load-balancing-type", "aux_loss", "global_aux_loss",
                                  "--moe-aux-loss-coeff", "0.01", "0.001", "--moe-layer-freq", "([0]+[1]*2)*4"});
  resolve_and_validate(a);
  EXPECT_EQ(a.moe.moe_ffn_hidden_size, a.model.ffn_hidden_size);  // Megatron's default
  EXPECT_EQ(a.parallel.expert_tensor_parallel_size, 1);          // = TP
  EXPECT_EQ(moe_load_balancing(a.moe), (std::vector<std::pair<std::string, double>>{{"aux_loss", 0.01},
                                                                                   {"global_aux_loss", 0.001}}));
  // One message lists every violation.
  expect_error([] {
    Arguments c = pipeline_args(4, {"--num-experts", "6", "--expert-model-parallel-size", "4", "--moe-router-topk", "1",
                                    "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
                                    "--moe-router-load-balancing-type", "aux_loss", "sinkhorn", "--moe-aux-loss-coeff",
                                    "0.1", "0.2", "0.3", "--moe-router-enable-expert-bias", "--moe-shared-expert-overlap",
                                    "--moe-layer-freq", "[1]*3", "--moe-pad-expert-input-to-capacity"});
    resolve_and_validate(c);
  }, {"--num-experts 6 must be divisible by --expert-model-parallel-size 4",
      "--moe-router-topk 1 with softmax scores needs --moe-router-pre-softmax",
      "--num-experts 6 must be divisible by --moe-router-num-groups 4",
      "--moe-router-topk 1 must be divisible by --moe-router-group-topk 2",
      "--moe-aux-loss-coeff gives 3 coefficients for 2 load-balancing types",
      "sinkhorn cannot be combined with other load-balancing types",
      "--moe-router-enable-expert-bias", "--moe-shared-expert-overlap needs", "--moe-layer-freq '[1]*3' gives 3 layers",
      "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor", "MoE needs --disable-bias-linear"});
  expect_error([] {
    Arguments c = pipeline_args(4, {"--disable-bias-linear", "--num-experts", "4", "--tensor-model-parallel-size", "2"});
    resolve_and_validate(c);
  }, {"MoE with --tensor-model-parallel-size 2 needs --sequence-parallel"});
  expect_error([] { Arguments c = pipeline_args(2, {"--expert-model-parallel-size", "2"}); resolve_and_validate(c); },
               {"--expert-model-parallel-size 2 needs --num-experts"});
}

TEST(Validate, MoeLayerFreqParsesIntegersAndListExpressions) {
  EXPECT_EQ(parse_moe_layer_freq("1", 3), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(parse_moe_layer_freq("[0]*2+[1]*2", 4), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(parse_moe_layer_freq("([1, 0] + [1]) * 2", 6), (std::vector<bool>{true, false, true, true, false, true}));
  expect_error([] { parse_moe_layer_freq("[0]*2+[2]", 3); }, {"must be 0 (dense) or 1 (MoE), got 2"});
  expect_error([] { parse_moe_layer_freq("[1]*2+", 3); }, {"expected '[' or '('", "position 6"});
  expect_error([] { parse_moe_layer_freq("[1]*2", 3); }, {"gives 2 layers but --num-layers is 3"});
  expect_error([] { parse_moe_layer_freq("0", 3); }, {"must be a positive integer"});
}

}  // namespace
}  // namespace megatron::train

namespace megatron::train {
namespace {

TEST(Flops, MoeLayersCountTheRoutedAndSharedExpertsAsMegatron) {
  // 12 layers of which 8 MoE ("([0]+[1]*2)*4"), h 768, ffn 3072 (GELU, k = 2), 8 experts, top-2, expert ffn
  // 1024, shared experts 512: Megatron's MLP term 6 h k (f dense + (f_moe topk + f_shared) moe) per token.
  Arguments a = pipeline_args(1, {"--disable-bias-linear", "--num-experts", "8", "--moe-ffn-hidden-size", "1024",
                                  "--moe-shared-expert-intermediate-size", "512", "--moe-layer-freq", "([0]+[1]*2)*4"});
  resolve_and_validate(a);
  Arguments dense = pipeline_args(1, {"--disable-bias-linear"});
  resolve_and_validate(dense);
  const double T = 4.0 * a.model.seq_length, h = 768, k = 2;
  const double want = 6 * h * k * T * (3072.0 * 4 + (1024.0 * 2 + 512) * 8 - 3072.0 * 12);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(a, 4) - num_floating_point_operations(dense, 4), want);
}

}  // namespace
}  // namespace megatron::train

namespace megatron::train {
namespace {

Arguments fp8_args(std::vector<std::string> extra) {
  std::vector<std::string> argv = gpt2_small();
  argv.pop_back();  // --data-path without a value: mock data
  argv.insert(argv.end(), extra.begin(), extra.end());
  Arguments a = parse_arguments(argv);
  a.parallel.world_size = 1;
  return a;
}

// FP8: Megatron's defaults become the model's recipe; every rule and every recipe this build cannot run is
// reported at once, naming the flag and the reason.
TEST(Validate, Fp8FlagsResolveAndEveryFp8RuleIsReported) {
  Arguments a = fp8_args({"--fp8-format", "hybrid"});
  resolve_and_validate(a);
  const nn::Fp8Recipe r = fp8_recipe(a);
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.scaling, nn::Fp8Scaling::Delayed);
  EXPECT_EQ(r.amax_history_len, 1);
  EXPECT_FALSE(r.amax_compute_max);
  EXPECT_EQ(r.grad_dtype(), DType::F8E5M2);
  EXPECT_FALSE(fp8_recipe(fp8_args({})).enabled);
  Arguments bf16_ends = fp8_args({"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                                  "--num-layers-at-end-in-bf16", "2"});
  resolve_and_validate(bf16_ends);
  const nn::Fp8Recipe e = fp8_recipe(bf16_ends);
  EXPECT_EQ(e.grad_dtype(), DType::F8E4M3);
  EXPECT_FALSE(e.fp8_layer(0, 12));
  EXPECT_TRUE(e.fp8_layer(1, 12));
  EXPECT_TRUE(e.fp8_layer(9, 12));
  EXPECT_FALSE(e.fp8_layer(10, 12));
  expect_error([] { Arguments c = fp8_args({"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--fp4-format", "e2m1",
                                            "--first-last-layers-bf16", "--fp8-amax-history-len", "0"});
                    resolve_and_validate(c); },
               {"--fp8-recipe mxfp8 needs Blackwell", "--fp4-format e2m1", "cannot be used together",
                "--fp8-amax-history-len 0 must be >= 1"});
  expect_error([] { Arguments c = fp8_args({"--fp8-format", "e4m3", "--first-last-layers-bf16",
                                            "--num-layers-at-start-in-bf16", "13"});
                    resolve_and_validate(c); },
               {"does not work with --fp8-recipe delayed", "--num-layers-at-start-in-bf16 13 must be between 0 and"});
  expect_error([] { Arguments c = fp8_args({"--fp8-recipe", "blockwise", "--fp8-format", "e4m3", "--fp8-param-gather"});
                    resolve_and_validate(c); },
               {"--fp8-param-gather with --fp8-recipe blockwise is not supported",
                "--fp8-param-gather needs --use-distributed-optimizer"});
  Arguments blockwise = fp8_args({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"});
  resolve_and_validate(blockwise);
  EXPECT_EQ(fp8_recipe(blockwise).scaling, nn::Fp8Scaling::Blockwise);
  EXPECT_EQ(fp8_recipe(blockwise).grad_dtype(), DType::F8E5M2);
  expect_error([] { Arguments c = fp8_args({"--fp8-param-gather"}); resolve_and_validate(c); },
               {"--fp8-param-gather needs --fp8-format"});
  expect_error([] { Arguments c = fp8_args({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-megatron-fsdp",
                                            "--use-distributed-optimizer", "--optimizer-cpu-offload"});
                    resolve_and_validate(c); },
               {"--fp8-param-gather needs --use-distributed-optimizer (without --use-megatron-fsdp)",
                "--fp8-param-gather with --optimizer-cpu-offload"});
  Arguments gathered = fp8_args({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer"});
  resolve_and_validate(gathered);
  EXPECT_TRUE(gathered.fp8.fp8_param_gather);
}

// Recomputation: Megatron's flags become the model's plan (units of layers for full, modules for selective);
// every rule and every module this build cannot recompute is reported at once.
TEST(Validate, RecomputeFlagsResolveAndEveryRuleIsReported) {
  Arguments full = fp8_args({"--recompute-granularity", "full", "--recompute-method", "uniform",
                             "--recompute-num-layers", "5"});  // gpt2_small has 12 layers
  resolve_and_validate(full);
  const nn::RecomputeConfig f = recompute_config(full);
  EXPECT_TRUE(f.full());
  EXPECT_EQ(f.units(12), (std::vector<std::pair<int, int>>{{0, 5}, {5, 5}, {10, 2}}));
  Arguments block = fp8_args({"--recompute-granularity", "full", "--recompute-method", "block",
                              "--recompute-num-layers", "2"});
  resolve_and_validate(block);
  EXPECT_EQ(recompute_config(block).units(12), (std::vector<std::pair<int, int>>{{0, 1}, {1, 1}}));
  Arguments legacy = fp8_args({"--recompute-activations"});
  resolve_and_validate(legacy);
  EXPECT_EQ(recompute_config(legacy).granularity, nn::RecomputeGranularity::Selective);
  EXPECT_FALSE(recompute_config(legacy).selective_mlp());  // Megatron's default module: core_attn
  Arguments mlp = fp8_args({"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"});
  resolve_and_validate(mlp);
  EXPECT_TRUE(recompute_config(mlp).selective_mlp());
  EXPECT_FALSE(recompute_config(mlp).selective_layernorm());
  Arguments norms = fp8_args({"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mlp"});
  resolve_and_validate(norms);
  EXPECT_TRUE(recompute_config(norms).selective_layernorm());
  EXPECT_TRUE(recompute_config(norms).selective_mlp());
  EXPECT_FALSE(recompute_config(norms).selective_moe_act());
  Arguments act = fp8_args({"--recompute-granularity", "selective", "--recompute-modules", "moe_act"});
  resolve_and_validate(act);
  EXPECT_TRUE(recompute_config(act).selective_moe_act());
  EXPECT_TRUE(recompute_config(fp8_args({})).units(12).empty());
  expect_error([] { Arguments c = fp8_args({"--recompute-granularity", "full", "--recompute-num-layers", "13"});
                    resolve_and_validate(c); },
               {"needs --recompute-method uniform or block", "--recompute-num-layers between 1 and the layers of a "
                "pipeline chunk (12); got 13"});
  expect_error([] { Arguments c = fp8_args({"--recompute-granularity", "selective", "--recompute-num-layers", "2",
                                            "--recompute-modules", "shared_experts", "moe", "attn"});
                    resolve_and_validate(c); },
               {"must not be given with --recompute-granularity selective", "'attn' is not one of Megatron's modules"});
  Arguments distributed = pipeline_args(2, {"--tensor-model-parallel-size", "2", "--recompute-granularity", "full",
                                            "--recompute-method", "uniform", "--recompute-num-layers", "1",
                                            "--distribute-saved-activations"});
  resolve_and_validate(distributed);
  EXPECT_TRUE(recompute_config(distributed).distribute_saved_activations);
  expect_error([] { Arguments c = fp8_args({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                            "--recompute-num-layers", "1", "--distribute-saved-activations"});
                    resolve_and_validate(c); },
               {"needs --tensor-model-parallel-size > 1"});
  expect_error([] { Arguments c = fp8_args({"--recompute-method", "block", "--distribute-saved-activations"});
                    resolve_and_validate(c); },
               {"--recompute-method block needs --recompute-granularity full",
                "--distribute-saved-activations needs --recompute-granularity full"});
  // Full recomputation takes MoE layers (a recomputed router records its statistics once: nn/moe_router.h).
  Arguments moe = fp8_args({"--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1", "--num-experts", "4", "--disable-bias-linear"});
  resolve_and_validate(moe);
  EXPECT_TRUE(recompute_config(moe).full());
}

}  // namespace
}  // namespace megatron::train
