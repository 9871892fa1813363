// Megatron-LM's command line: `--hidden-size 768`, `--hidden-size=768`, `--bf16`, `--data-path 0.7 A 0.3 B`.
//
// Contract: parse_arguments() reads every flag into Arguments and reports *all* problems at once in one
// megatron::Error: an unknown flag names the nearest known one ("did you mean --hidden-size?"), a value
// that does not parse names the flag, the text and the expected type, a choice outside its set lists the
// set. Derived defaults and cross-field constraints are resolve_and_validate()'s job (arguments.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::train {

// argv without the program name.
Arguments parse_arguments(const std::vector<std::string>& args);

// All known flags with their help text and defaults, for --help.
std::string flags_help();

// Megatron's start-of-run print: every argument by flag name and value, sorted.
std::string describe_arguments(const Arguments& args);

// Checkpoints: the resolved arguments as (key, value) pairs, key = flag name without "--" and
// with '_' for '-' ("num_layers"), value as printed by describe_arguments ("True"/"False" for switches);
// and the command line that sets `values` back (switches "True" -> present, "False" -> absent). Keys that
// are not flags are ignored.
std::vector<std::pair<std::string, std::string>> argument_values(const Arguments& args);
std::vector<std::string> flags_for_values(const std::vector<std::pair<std::string, std::string>>& values);

// Every flag pretrain_gpt knows with its status: "supported" (Megatron's meaning), "no-op" (accepted, changes
// nothing here: `reason` says why) or "refused" (`reason` says why and what to use instead), in --help order.
struct FlagStatusRow {
  std::string name, status, reason;
  bool takes_value = true, takes_list = false;
};
std::vector<FlagStatusRow> flag_statuses();

// The known flag closest to `unknown` (edit distance), or "" when none is close.
std::string nearest_flag(const std::string& unknown);
// Levenshtein distance (insertions, deletions, substitutions of bytes).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace megatron::train
