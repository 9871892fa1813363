#include "megatron/trainer/checkpoint_args.h"

#include <algorithm>

#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/core/error.h"
#include "megatron/train/flags.h"

namespace megatron::trainer {

std::vector<std::string> apply_checkpoint_args(train::Arguments& args) {
  if (!args.checkpoint.use_checkpoint_args) return {};
  MEGATRON_CHECK(!args.checkpoint.load.empty(), "--use-checkpoint-args requires --load (the checkpoint whose args to use)");
  const checkpoint::CheckpointReader reader =
      checkpoint::CheckpointReader::open(checkpoint::checkpoint_to_load(args.checkpoint.load, args.checkpoint.ckpt_step));
  const train::Arguments saved = checkpoint::arguments_from_state(reader.state());
  train::ModelArguments& m = args.model;
  const train::ModelArguments given = m;
  m = saved.model;
  // Megatron fills these only when the command line leaves them unset.
  auto keep = [](int& out, int cli) {
    if (cli != 0) out = cli;
  };
  keep(m.num_layers, given.num_layers);
  keep(m.hidden_size, given.hidden_size);
  keep(m.ffn_hidden_size, given.ffn_hidden_size);
  keep(m.seq_length, given.seq_length);
  keep(m.num_attention_heads, given.num_attention_heads);
  keep(m.kv_channels, given.kv_channels);
  keep(m.max_position_embeddings, given.max_position_embeddings);
  keep(m.vocab_size, given.vocab_size);
  const train::MoeArguments given_moe = args.moe;
  const std::string dispatcher = args.moe.moe_token_dispatcher_type;
  args.moe = saved.moe;
  if (dispatcher != train::MoeArguments{}.moe_token_dispatcher_type) args.moe.moe_token_dispatcher_type = dispatcher;

  // What changed, by flag, for the log.
  train::Arguments before, after;
  before.model = given;
  before.moe = given_moe;
  after.model = m;
  after.moe = args.moe;
  std::vector<std::string> changes;
  const auto old_values = train::argument_values(before), new_values = train::argument_values(after);
  for (size_t i = 0; i < new_values.size(); ++i)
    if (old_values[i].second != new_values[i].second) {
      std::string flag = "--" + new_values[i].first;
      std::replace(flag.begin(), flag.end(), '_', '-');
      changes.push_back(str_cat(flag, " ", new_values[i].second, " (from the checkpoint)"));
    }
  return changes;
}

}  // namespace megatron::trainer
