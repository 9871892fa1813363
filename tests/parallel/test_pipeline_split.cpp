// Which layers each pipeline stage holds (parallel/pipeline_split.h), against Megatron's
// get_num_layers_to_build / get_transformer_layer_offset worked out by hand: even splits, interleaved chunks,
// the embedding and loss counted as layers, uneven first/last stages (with and without chunks); and the
// combinations Megatron lets through that drop or misplace layers (its issue #1778), refused here with the flags
// named.
#include <gtest/gtest.h>

#include "harness.h"
#include "megatron/parallel/pipeline_split.h"

namespace megatron::parallel {
namespace {

std::string split_of(PipelineSplitConfig c) { return describe(split_layers(c)); }

TEST(PipelineSplit, EvenAndInterleaved) {
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2}), "rank 0: [0, 4); rank 1: [4, 8)");
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2, .virtual_size = 2}),
            "rank 0: [0, 2) [4, 6); rank 1: [2, 4) [6, 8)");
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2, .virtual_size = 4}),
            "rank 0: [0, 1) [2, 3) [4, 5) [6, 7); rank 1: [1, 2) [3, 4) [5, 6) [7, 8)");
  EXPECT_EQ(split_of({.num_layers = 5, .pipeline_size = 1}), "rank 0: [0, 5)");
}

TEST(PipelineSplit, EmbeddingAndLossCountedAsLayers) {
  EXPECT_EQ(split_of({.num_layers = 6, .pipeline_size = 4, .account_for_embedding = true, .account_for_loss = true}),
            "rank 0: [0, 1); rank 1: [1, 3); rank 2: [3, 5); rank 3: [5, 6)");
  EXPECT_EQ(split_of({.num_layers = 7, .pipeline_size = 2, .account_for_embedding = true}), "rank 0: [0, 3); rank 1: [3, 7)");
  EXPECT_EQ(split_of({.num_layers = 6, .pipeline_size = 2, .virtual_size = 2, .account_for_embedding = true,
                      .account_for_loss = true}),
            "rank 0: [0, 1) [3, 5); rank 1: [1, 3) [5, 6)");
}

TEST(PipelineSplit, UnevenFirstAndLastStages) {
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 4, .first_stage_layers = 1, .last_stage_layers = 3}),
            "rank 0: [0, 1); rank 1: [1, 3); rank 2: [3, 5); rank 3: [5, 8)");
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2, .first_stage_layers = 3}), "rank 0: [0, 3); rank 1: [3, 8)");
  EXPECT_EQ(split_of({.num_layers = 12, .pipeline_size = 3, .virtual_size = 2, .first_stage_layers = 2,
                      .last_stage_layers = 2}),
            "rank 0: [0, 1) [6, 7); rank 1: [1, 5) [7, 11); rank 2: [5, 6) [11, 12)");
}

// Megatron's PipelineParallelLayerLayout worked out by hand: virtual stage s is chunk s / PP of rank s % PP.
TEST(PipelineSplit, CustomLayoutPlacesEveryStage) {
  EXPECT_EQ(parse_pipeline_layout("Et*2|(tt|)*2,t*3L"), (std::vector<std::string>{"Ett", "tt", "tt", "tttL"}));
  EXPECT_EQ(parse_pipeline_layout("E(t|t)*2L"), (std::vector<std::string>{"Et", "tt", "tL"}));
  EXPECT_EQ(parse_pipeline_layout("Et*10|t*12L"), (std::vector<std::string>{"Etttttttttt", "ttttttttttttL"}));
  // Balanced for a heavy loss stage without interleaving, and with interleaving where the first rank's 5
  // layers are not divisible by its 2 chunks (which the uneven flags cannot express).
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2, .layout = "Et*5|t*3L"}), "rank 0: [0, 5); rank 1: [5, 8)");
  EXPECT_EQ(split_of({.num_layers = 8, .pipeline_size = 2, .virtual_size = 2, .layout = "Et*3|t*2|t*2|tL"}),
            "rank 0: [0, 3) [5, 7); rank 1: [3, 5) [7, 8)");
  EXPECT_EQ(split_of({.num_layers = 6, .pipeline_size = 3, .layout = "E|t*3|t*3L"}), "rank 0: [0, 0); rank 1: [0, 3); rank 2: [3, 6)");
}

TEST(PipelineSplit, MalformedOrMismatchedLayoutsAreRefused) {
  testing::expect_error([] { parse_pipeline_layout("Et*4|x*4L"); }, {"unknown character 'x'", "at character 6"});
  testing::expect_error([] { parse_pipeline_layout("E(t|t*2L"); }, {"'(' is never closed"});
  testing::expect_error([] { parse_pipeline_layout("Et)|tL"); }, {"')' without a matching '('"});
  testing::expect_error([] { parse_pipeline_layout("Et*|tL"); }, {"'*' needs a count"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .layout = "Et*3|t*3|t*2L"}); },
                        {"has 3 stages: not a multiple of --pipeline-model-parallel-size 2"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .layout = "Et*4|t*3L"}); },
                        {"places 7 transformer layers", "--num-layers is 8"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .layout = "t*4E|t*4L"}); },
                        {"the embedding 'E' must appear once, opening the first stage"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .layout = "Et*4L|t*4"}); },
                        {"the loss 'L' must appear once, closing the last stage"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .layout = "Et*4|t*4mL"}); },
                        {"multi-token prediction layers ('m') are not supported"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .first_stage_layers = 5,
                                           .layout = "Et*5|t*3L"}); },
                        {"cannot be combined with --decoder-first/last-pipeline-num-layers"});
}

TEST(PipelineSplit, CombinationsThatWouldDropLayersAreRefused) {
  // Megatron builds 3 + 3 layers here and silently drops two (nothing is left for middle stages).
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .first_stage_layers = 3,
                                           .last_stage_layers = 3}); },
                        {"places 6 of the 8 layers", "dropped", "--decoder-first/last-pipeline-num-layers"});
  testing::expect_error([] { split_layers({.num_layers = 9, .pipeline_size = 4, .first_stage_layers = 1}); },
                        {"8 layers left", "divisible by the 3 other stages"});
  testing::expect_error([] { split_layers({.num_layers = 7, .pipeline_size = 2}); },
                        {"--num-layers 7 must be divisible by --pipeline-model-parallel-size 2"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .virtual_size = 3}); },
                        {"4 layers per pipeline stage must be divisible by the 3 model chunks"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .first_stage_layers = 3,
                                           .account_for_embedding = true}); },
                        {"cannot be combined with --account-for-embedding-in-pipeline-split"});
  testing::expect_error([] { split_layers({.num_layers = 8, .pipeline_size = 2, .virtual_size = 2,
                                           .first_stage_layers = 3}); },
                        {"--decoder-first-pipeline-num-layers 3 must be divisible by the 2 model chunks"});
  testing::expect_error([] { split_layers({.num_layers = 4, .pipeline_size = 2, .first_stage_layers = 6}); },
                        {"--decoder-first-pipeline-num-layers 6 exceeds --num-layers 4"});
}

}  // namespace
}  // namespace megatron::parallel
