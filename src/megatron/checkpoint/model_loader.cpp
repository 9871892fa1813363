#include "megatron/checkpoint/model_loader.h"

#include <charconv>

#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/train/model_config.h"

namespace megatron::checkpoint {

namespace {

LoadedModel load_model_from(Context& ctx, CheckpointReader& reader, DType dtype) {
  const nlohmann::json& state = reader.state();
  train::Arguments args = arguments_from_state(state);
  args.model.hidden_dropout = 0;
  args.model.attention_dropout = 0;
  train::resolve(args);
  uint64_t seed = 1234;
  if (state.contains("rng") && state["rng"].contains("seed")) seed = state["rng"]["seed"].get<uint64_t>();
  nn::TransformerConfig config = train::transformer_config(args.model, dtype, seed);
  config.moe = train::moe_config(args.moe, args.model);  // MoE layers where the checkpoint has them
  if (state.contains("args") && state["args"].contains("padded_vocab_size")) {
    const std::string text = state["args"]["padded_vocab_size"].get<std::string>();
    int64_t padded = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), padded);
    MEGATRON_CHECK(error == std::errc() && end == text.data() + text.size() && padded >= args.model.vocab_size,
                   "checkpoint ", reader.directory().string(), ": saved padded_vocab_size ", quoted_bytes(text),
                   " is not a number at least the vocabulary size ", args.model.vocab_size);
    config.padded_vocab_size = padded;
  }
  LoadedModel out;
  out.model = std::make_unique<nn::GPTModel>(ctx, config);
  out.iteration = reader.iteration();
  out.vocab_size = args.model.vocab_size;
  for (nn::Parameter* p : out.model->parameters())
    reader.load(ctx, whole_tensor(p->name, p->value.shape().dims(), p->value.dtype()), p->value);
  ctx.synchronize();
  return out;
}

}  // namespace

LoadedModel load_model(Context& ctx, const std::filesystem::path& checkpoint, DType dtype) {
  CheckpointReader reader = CheckpointReader::open(checkpoint);
  try {
    return load_model_from(ctx, reader, dtype);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint metadata ", (reader.directory() / kMetadataFile).string(),
                  ": the saved state is malformed: ", e.what());
  }
}

}  // namespace megatron::checkpoint
