// --use-checkpoint-args: the model's arguments from the --load checkpoint's saved args, as Megatron's
// load_args_from_checkpoint sets them. The sizes Megatron only fills when the command line leaves them unset
// (--num-layers, --hidden-size, --ffn-hidden-size, --seq-length, --num-attention-heads, --kv-channels,
// --max-position-embeddings, --moe-token-dispatcher-type; and the vocabulary here) keep a value given on the
// command line; every other architecture and MoE argument is the checkpoint's (Megatron's force=True).
#pragma once

#include <string>
#include <vector>

#include "megatron/train/arguments.h"

namespace megatron::trainer {

// Applies the checkpoint's arguments to `args` (parsed, not yet resolved) when --use-checkpoint-args is set;
// returns one line per argument changed (for the log). Throws megatron::Error without --load, or when the
// checkpoint has no saved args.
std::vector<std::string> apply_checkpoint_args(train::Arguments& args);

}  // namespace megatron::trainer
