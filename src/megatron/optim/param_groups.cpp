#include "megatron/optim/param_groups.h"

namespace megatron::optim {

bool is_no_weight_decay_param(std::string_view name, const Shape& shape) {
  return name.ends_with(".bias") || shape.rank() == 1;
}

bool is_embedding_or_output_parameter(std::string_view name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

std::vector<ParamGroup> build_param_groups(const std::vector<NamedParamShape>& params) {
  std::vector<ParamGroup> groups(2);
  groups[0].wd_mult = 1.0;
  groups[0].no_weight_decay = false;
  groups[1].wd_mult = 0.0;
  groups[1].no_weight_decay = true;
  for (size_t i = 0; i < params.size(); ++i)
    groups[is_no_weight_decay_param(params[i].name, params[i].shape) ? 1 : 0].indices.push_back(i);
  return groups;
}

}  // namespace megatron::optim
