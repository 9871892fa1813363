// The activation-recomputation flags' rules (Megatron's TransformerConfig checks, plus what this
// implementation refuses and why) and their translation into the model's nn::RecomputeConfig.
#pragma once

#include <string>
#include <vector>

#include "megatron/nn/recompute.h"
#include "megatron/train/arguments.h"

namespace megatron::train {

// Every violated rule, one sentence each naming the flags and values (empty without recompute flags).
std::vector<std::string> recompute_violations(const Arguments& args);

// What the model recomputes (granularity None without the flags).
nn::RecomputeConfig recompute_config(const Arguments& args);

}  // namespace megatron::train
