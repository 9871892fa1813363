// Megatron-LM's optimizer parameter groups (megatron/core/optimizer/__init__.py, _get_param_groups with
// the standard overrides): a parameter gets no weight decay (wd_mult 0) when its name matches "*.bias"
// (ends with ".bias") or it has exactly one dimension (norm weights and biases); everything else, 0-d
// scalars included, decays (wd_mult 1). Groups come in Megatron's order: the default (decayed) group
// first, then the no-decay group; both are always returned, possibly empty, so every rank has the same
// groups (Megatron aligns them across ranks for checkpoints).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/tensor/shape.h"

namespace megatron::optim {

struct NamedParamShape {
  std::string name;  // "decoder.layers.0.self_attention.linear_qkv.bias"
  Shape shape;
};

struct ParamGroup {
  double wd_mult = 1.0;          // the scheduled weight decay is multiplied by this (0 or 1)
  bool no_weight_decay = false;  // wd_mult == 0
  std::vector<size_t> indices;   // into the input list, in input order
};

bool is_no_weight_decay_param(std::string_view name, const Shape& shape);

// Megatron's is_embedding_or_output_parameter (LanguageModule.setup_embeddings_and_output_layer): the word
// embeddings and the output layer's weight -- also the last pipeline stage's copy of tied word embeddings,
// which carries the embeddings' name. Learned position embeddings are not among them. --decoupled-lr and
// --decoupled-min-lr schedule these parameters' learning rate apart from the rest.
bool is_embedding_or_output_parameter(std::string_view name);

// [decayed group, no-decay group].
std::vector<ParamGroup> build_param_groups(const std::vector<NamedParamShape>& params);

}  // namespace megatron::optim
