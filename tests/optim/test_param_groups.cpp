// Megatron's weight-decay rule on GPT/Llama parameter names: biases and 1-D tensors (norm weights) get no
// weight decay; matrices, embeddings and 0-d scalars do; groups in Megatron's order.
#include <gtest/gtest.h>

#include "megatron/optim/param_groups.h"

namespace megatron::optim {
namespace {

TEST(ParamGroups, MegatronRule) {
  const std::vector<NamedParamShape> params = {
      {"embedding.word_embeddings.weight", Shape{50304, 768}},
      {"embedding.position_embeddings.weight", Shape{1024, 768}},
      {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", Shape{768}},
      {"decoder.layers.0.self_attention.linear_qkv.layer_norm_bias", Shape{768}},
      {"decoder.layers.0.self_attention.linear_qkv.weight", Shape{2304, 768}},
      {"decoder.layers.0.self_attention.linear_qkv.bias", Shape{2304}},
      {"decoder.layers.0.mlp.linear_fc1.weight", Shape{3072, 768}},
      {"decoder.layers.0.mlp.linear_fc2.bias", Shape{768}},
      {"decoder.final_layernorm.weight", Shape{768}},
      {"odd.bias", Shape{4, 4}},         // ".bias" by name even when 2-D
      {"mixer.biasing", Shape{4, 4}},    // not "*.bias"
      {"logit_scale", Shape{}},          // 0-d: decays (len(shape) != 1)
      {"bias", Shape{3, 3}},             // no "." before bias: decays
  };
  const std::vector<bool> expected_no_wd = {false, false, true, true, false, true, false, true, true,
                                            true,  false, false, false};
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(is_no_weight_decay_param(params[i].name, params[i].shape), expected_no_wd[i]) << params[i].name;

  const std::vector<ParamGroup> groups = build_param_groups(params);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups[0].no_weight_decay);
  EXPECT_EQ(groups[0].wd_mult, 1.0);
  EXPECT_TRUE(groups[1].no_weight_decay);
  EXPECT_EQ(groups[1].wd_mult, 0.0);
  EXPECT_EQ(groups[0].indices, (std::vector<size_t>{0, 1, 4, 6, 10, 11, 12}));
  EXPECT_EQ(groups[1].indices, (std::vector<size_t>{2, 3, 5, 7, 8, 9}));
}

// Megatron's is_embedding_or_output_parameter marks exactly the word embeddings (also the last stage's tied copy,
// which has their name) and the output layer's weight: not position embeddings, norms or layers.
TEST(ParamGroups, EmbeddingOrOutputParametersAreTheWordEmbeddingsAndTheOutputLayer) {
  EXPECT_TRUE(is_embedding_or_output_parameter("embedding.word_embeddings.weight"));
  EXPECT_TRUE(is_embedding_or_output_parameter("output_layer.weight"));
  for (const char* other : {"embedding.position_embeddings.weight", "decoder.final_layernorm.weight",
                            "decoder.layers.0.mlp.linear_fc1.weight", "output_layer.bias",
                            "decoder.layers.0.embedding.word_embeddings.weight", "word_embeddings.weight"})
    EXPECT_FALSE(is_embedding_or_output_parameter(other)) << other;
}

TEST(ParamGroups, BothGroupsAlwaysPresent) {
  std::vector<ParamGroup> groups = build_param_groups({});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(groups[0].indices.empty());
  EXPECT_TRUE(groups[1].indices.empty());
  groups = build_param_groups({{"w", Shape{2, 2}}});
  EXPECT_EQ(groups[0].indices, (std::vector<size_t>{0}));
  EXPECT_TRUE(groups[1].indices.empty());
}

}  // namespace
}  // namespace megatron::optim
