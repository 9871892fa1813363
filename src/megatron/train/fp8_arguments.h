// The FP8 flags' rules (Megatron's validate_args and TransformerConfig checks for FP8, plus what this
// implementation refuses and why) and their translation into the model's nn::Fp8Recipe.
#pragma once

#include <string>
#include <vector>

#include "megatron/nn/fp8_recipe.h"
#include "megatron/train/arguments.h"

namespace megatron::train {

// Every violated FP8 rule, one sentence each naming the flags and values (empty without FP8 flags).
std::vector<std::string> fp8_violations(const Arguments& args);

// The recipe the model runs (enabled iff --fp8-format is given).
nn::Fp8Recipe fp8_recipe(const Arguments& args);

}  // namespace megatron::train
