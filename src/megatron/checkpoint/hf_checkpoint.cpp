#include "megatron/checkpoint/hf_checkpoint.h"

#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/shard_writer.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/core/error.h"
#include "megatron/parallel/pipeline_split.h"
#include "megatron/train/flags.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

ImportSummary import_hf_checkpoint(const fs::path& hf_dir, const fs::path& save_root, int target_tp,
                                   std::optional<DType> dtype, int target_pp) {
  MEGATRON_CHECK(target_tp >= 1, "convert: --target-tensor-parallel-size ", target_tp, " must be >= 1");
  MEGATRON_CHECK(target_pp >= 1, "convert: --target-pipeline-parallel-size ", target_pp, " must be >= 1");
  const json config = read_hf_config(hf_dir);
  ImportSummary s;
  s.family = hf_family_of(config);
  s.args = arguments_from_hf(config);
  for (const std::string& v :
       parallel::pipeline_split_violations({.num_layers = s.args.model.num_layers, .pipeline_size = target_pp}))
    MEGATRON_FAIL("convert: --target-pipeline-parallel-size ", target_pp, ": ", v);
  train::Arguments all = s.args;
  all.parallel.tensor_model_parallel_size = target_tp;
  s.padded_vocab = all.padded_vocab_size();
  TensorMap ours = hf_to_megatron(s.family, s.args, s.padded_vocab, read_hf_weights(hf_dir));
  if (dtype) cast_floats(ours, *dtype);
  s.tensors = ours.size();

  json args = json::object();
  for (const auto& [k, v] : train::argument_values(all)) args[k] = v;
  args["padded_vocab_size"] = std::to_string(s.padded_vocab);
  args["params_dtype"] = dtype_name(ours.at("embedding.word_embeddings.weight").dtype);
  json state = {{"iteration", 0},
                {"args", args},
                {"hf_config", config},
                {"converted_from",
                 {{"format", "huggingface"}, {"model_type", hf_family_name(s.family)},
                  {"target_tensor_parallel_size", target_tp}, {"target_pipeline_parallel_size", target_pp}}}};
  std::vector<SaveItem> items;
  for (auto& [name, t] : ours)
    items.push_back({whole_tensor(name, t.shape, t.dtype),
                     Tensor::from_blob(t.bytes.data(), Shape(t.shape), t.dtype, Device::cpu())});
  auto ctx = Context::cpu();
  SaveOptions options;
  options.release = true;
  save_checkpoint(*ctx, save_root, 0, items, state, options);
  return s;
}

ExportSummary export_hf_checkpoint(const fs::path& load_root, const fs::path& hf_dir, std::optional<HfFamily> family,
                                   std::optional<DType> dtype) {
  CheckpointReader reader = CheckpointReader::open(load_root);
  const json& state = reader.state();
  train::Arguments all = arguments_from_state(state);
  train::resolve(all);
  const train::ModelArguments& m = all.model;
  ExportSummary s;
  if (family) {
    s.family = *family;
  } else if (state.contains("converted_from") && state["converted_from"].contains("model_type")) {
    s.family = parse_hf_family(state["converted_from"]["model_type"].get<std::string>());
  } else {
    const bool moe = all.moe.num_experts > 0;
    s.family = m.position_embedding_type == "learned_absolute" && m.normalization == "LayerNorm" ? HfFamily::GPT2
               : m.qk_layernorm ? (moe ? HfFamily::Qwen3Moe : HfFamily::Qwen3)
               : moe            ? (all.moe.moe_shared_expert_gate ? HfFamily::Qwen2Moe : HfFamily::Mixtral)
                                : HfFamily::Llama;
  }
  const json base = state.contains("hf_config") ? state["hf_config"] : json::object();
  // The config first: it refuses a model the family cannot express, naming why.
  const auto word = reader.metadata().tensors.find("embedding.word_embeddings.weight");
  MEGATRON_CHECK(word != reader.metadata().tensors.end(), "convert: ", load_root.string(),
                 " has no embedding.word_embeddings.weight");
  const DType stored = word->second.dtype;
  const json config = hf_config_from_model(s.family, all, dtype ? *dtype : stored, base);
  auto ctx = Context::cpu();
  TensorMap ours;
  for (const auto& [key, entry] : reader.metadata().tensors) {
    if (key.rfind("optimizer.", 0) == 0) continue;
    HostTensor t;
    t.dtype = entry.dtype;
    t.shape = entry.global_shape;
    t.bytes.resize(size_t(t.numel()) * dtype_size(t.dtype));
    reader.load_whole(*ctx, key, Tensor::from_blob(t.bytes.data(), Shape(t.shape), t.dtype, Device::cpu()));
    ours[key] = std::move(t);
  }
  TensorMap hf = megatron_to_hf(s.family, all, ours, &s.warnings);
  cast_floats(hf, dtype ? *dtype : stored);
  s.tensors = hf.size();
  write_hf_checkpoint(hf_dir, config, hf);
  return s;
}

}  // namespace megatron::checkpoint
