// Which transformer layers each pipeline stage holds: Megatron's get_num_layers_to_build and
// get_transformer_layer_offset (megatron/core/transformer/{transformer_block,transformer_layer}.py), as one pure
// function of the layer count and the split flags.
//
//   even split:      (L + [embedding] + [loss]) layers over PP ranks, each rank's share over its V model chunks;
//                    with --account-for-embedding-in-pipeline-split the first stage's first chunk has one layer
//                    fewer (the embedding counts as one), with --account-for-loss-in-pipeline-split the last
//                    stage's last chunk likewise;
//   uneven split:    --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers fix the first / last
//                    rank's layers, the others share the rest evenly (each rank's share again over V chunks);
//   custom layout:   --pipeline-model-parallel-layout lists every virtual stage's layers (Megatron's
//                    PipelineParallelLayerLayout), e.g. "Et*9|t*8|t*8|t*7L": 'E' the embedding, 't' one
//                    transformer layer, 'L' the output layer and loss, '|' between virtual stages, "x*n" and
//                    "(...)*n" repeat, ',' is cosmetic. PP x V stages in virtual-stage order, so V = stages / PP.
//                    It balances stages that the even rules cannot (the loss stage is heavier; with
//                    interleaving, a first-stage count that V does not divide).
// Model chunk c of pipeline rank r is virtual stage c * PP + r: virtual stages hold consecutive layers in that
// order (with 8 layers, PP 2, V 2: rank 0 holds [0, 2) and [4, 6), rank 1 [2, 4) and [6, 8)).
//
// Unlike Megatron, the result is checked: the virtual stages must tile [0, L) exactly, so a combination that
// would drop or duplicate layers (uneven counts that leave layers to no stage, remainders that do not divide)
// is an error naming the flags, not a smaller model with inflated FLOP counts.
#pragma once

#include <string>
#include <vector>

namespace megatron::parallel {

struct PipelineSplitConfig {
  int num_layers = 0;
  int pipeline_size = 1;
  int virtual_size = 1;           // model chunks per pipeline rank
  int first_stage_layers = -1;    // -1: not given
  int last_stage_layers = -1;
  bool account_for_embedding = false;
  bool account_for_loss = false;
  std::string layout;             // --pipeline-model-parallel-layout; empty: not given
};

struct ChunkLayers {
  int first_layer = 0;  // global number
  int num_layers = 0;
};

// chunks[r][c]: model chunk c of pipeline rank r.
struct PipelineSplit {
  std::vector<std::vector<ChunkLayers>> chunks;
};

// The virtual stages of a --pipeline-model-parallel-layout text, each as its layer letters with repeats
// expanded ("Et*2|tL" -> {"Ett", "tL"}). A malformed text (unknown letter, unbalanced parentheses, a repeat
// without a count) throws megatron::Error naming the position.
std::vector<std::string> parse_pipeline_layout(const std::string& text);

// Every violated constraint (empty when the split is valid), one sentence each naming the flags.
std::vector<std::string> pipeline_split_violations(const PipelineSplitConfig& config);
// The split; throws megatron::Error listing every violation.
PipelineSplit split_layers(const PipelineSplitConfig& config);
// "rank 0: [0, 2) [4, 6); rank 1: [2, 4) [6, 8)" for logs and errors.
std::string describe(const PipelineSplit& split);

}  // namespace megatron::parallel
