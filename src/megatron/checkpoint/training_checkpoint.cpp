#include "megatron/checkpoint/training_checkpoint.h"

#include <algorithm>

#include "megatron/core/error.h"
#include "megatron/train/flags.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

const std::string kFp32Param = "optimizer.state.fp32_param.";
const std::string kExpAvg = "optimizer.state.exp_avg.";
const std::string kExpAvgSq = "optimizer.state.exp_avg_sq.";

std::vector<int64_t> dims(const Tensor& t) { return t.shape().dims(); }

std::string value_of(const std::vector<std::pair<std::string, std::string>>& values, const std::string& key) {
  for (const auto& [k, v] : values)
    if (k == key) return v;
  return "";
}

// The flags that decide parameter shapes and the forward computation.
const char* const kArchitectureKeys[] = {
    "num_layers",     "hidden_size",  "num_attention_heads", "num_query_groups",
    "ffn_hidden_size", "kv_channels", "position_embedding_type", "rotary_percent",
    "rotary_base",    "swiglu",       "normalization",       "norm_epsilon",
    "untie_embeddings_and_output_weights", "disable_bias_linear",
};

}  // namespace

std::vector<std::pair<std::string, std::string>> architecture_values(const nn::ModelConfig& config) {
  train::Arguments a;
  a.model = config.args;
  const auto all = train::argument_values(a);
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* key : kArchitectureKeys) out.emplace_back(key, value_of(all, key));
  if (config.position_embedding() == nn::PositionEmbedding::LearnedAbsolute)
    out.emplace_back("max_position_embeddings", value_of(all, "max_position_embeddings"));
  out.emplace_back("padded_vocab_size", std::to_string(config.padded_vocab_size));
  return out;
}

std::vector<std::string> architecture_differences(const nlohmann::json& saved_args, const nn::ModelConfig& config) {
  std::vector<std::string> diffs;
  for (const auto& [key, value] : architecture_values(config)) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (key == "padded_vocab_size") flag = "padded vocabulary size";
    if (!saved_args.contains(key)) {
      diffs.push_back(str_cat(flag, ": not in the checkpoint, this run ", value));
      continue;
    }
    const std::string saved = saved_args[key].get<std::string>();
    if (saved != value) diffs.push_back(str_cat(flag, ": checkpoint ", saved, ", this run ", value));
  }
  return diffs;
}

train::ModelArguments model_arguments_from_state(const nlohmann::json& state) {
  MEGATRON_CHECK(state.contains("args") && state["args"].is_object(), "checkpoint state has no saved args");
  std::vector<std::pair<std::string, std::string>> values;
  const train::Arguments defaults;
  const auto known = train::argument_values(defaults);
  for (const auto& [key, value] : state["args"].items()) {
    // Only model flags: anything else (data paths, schedules) is irrelevant to rebuilding the model.
    if (!value.is_string()) continue;
    bool is_model = false;
    for (const char* k : kArchitectureKeys) is_model = is_model || key == k;
    is_model = is_model || key == "max_position_embeddings" || key == "seq_length" || key == "vocab_size" ||
               key == "make_vocab_size_divisible_by" || key == "init_method_std" || key == "hidden_dropout" ||
               key == "attention_dropout" || key == "group_query_attention";
    if (is_model) values.emplace_back(key, value.get<std::string>());
  }
  return train::parse_arguments(train::flags_for_values(values)).model;
}

std::vector<SaveItem> training_save_items(const TrainingState& state, bool save_optim) {
  MEGATRON_CHECK(state.model != nullptr, "save_training_checkpoint: no model");
  std::vector<SaveItem> items;
  nn::ParameterList params = state.model->parameters();
  for (nn::Parameter* p : params)
    items.push_back({whole_tensor(p->name, dims(p->value), p->value.dtype()), p->value});
  if (save_optim && state.optimizer != nullptr) {
    const optim::AdamW& opt = *state.optimizer;
    MEGATRON_CHECK(opt.size() == params.size(), "save_training_checkpoint: the optimizer holds ", opt.size(),
                   " tensors but the model has ", params.size(), " parameters");
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::Parameter& p = *params[i];
      const std::vector<int64_t> shape = dims(p.value);
      if (opt.master(i).data_ptr() != p.value.data_ptr())
        items.push_back({whole_tensor(kFp32Param + p.name, shape, opt.master(i).dtype()), opt.master(i)});
      items.push_back({whole_tensor(kExpAvg + p.name, shape, opt.exp_avg(i).dtype()), opt.exp_avg(i)});
      items.push_back({whole_tensor(kExpAvgSq + p.name, shape, opt.exp_avg_sq(i).dtype()), opt.exp_avg_sq(i)});
    }
  }
  return items;
}

nlohmann::json training_state_json(const TrainingState& state, bool save_optim, bool save_rng) {
  MEGATRON_CHECK(state.model != nullptr && state.args != nullptr, "save_training_checkpoint: model and args required");
  const nn::ModelConfig& config = state.model->config();
  nlohmann::json j;
  j["iteration"] = state.iteration;
  j["consumed_train_samples"] = state.consumed_train_samples;
  j["consumed_valid_samples"] = state.consumed_valid_samples;
  nlohmann::json args = nlohmann::json::object();
  for (const auto& [k, v] : train::argument_values(*state.args)) args[k] = v;
  // The model's own view wins (e.g. a converted checkpoint's args are only the model's).
  train::Arguments model_only;
  model_only.model = config.args;
  for (const auto& [k, v] : train::argument_values(model_only))
    if (!args.contains(k)) args[k] = v;
  args["padded_vocab_size"] = std::to_string(config.padded_vocab_size);
  args["params_dtype"] = dtype_name(config.params_dtype);
  j["args"] = std::move(args);
  if (save_optim && state.optimizer != nullptr) {
    const optim::AdamW& opt = *state.optimizer;
    j["optimizer"] = {{"step", opt.step_count()},
                      {"beta1", opt.options().beta1},
                      {"beta2", opt.options().beta2},
                      {"eps", opt.options().eps}};
    if (state.scheduler != nullptr) j["scheduler"] = {{"num_steps", state.scheduler->num_steps()}};
    if (state.scaler != nullptr) {
      const optim::LossScalerState s = state.scaler->state();
      j["loss_scaler"] = {{"scale", s.scale}, {"growth_tracker", s.growth_tracker},
                          {"hysteresis_tracker", s.hysteresis_tracker}};
    }
  }
  if (save_rng)
    j["rng"] = {{"seed", config.seed},
                {"generator", "philox4x32-10"},
                {"offsets", "init: hash of the parameter name; dropout: derived from the iteration"}};
  return j;
}

uint64_t save_training_checkpoint(Context& ctx, const fs::path& root, const TrainingState& state,
                                  const train::CheckpointArguments& flags, AsyncSaver* async, const SaveHooks& hooks) {
  const bool save_optim = !flags.no_save_optim;
  std::vector<SaveItem> items = training_save_items(state, save_optim);
  nlohmann::json json = training_state_json(state, save_optim, !flags.no_save_rng);
  SaveOptions options{.keep_last = flags.keep_last, .hooks = hooks};
  uint64_t bytes = 0;
  for (const SaveItem& item : items) bytes += item.data.nbytes();
  if (async != nullptr) {
    async->submit(root, state.iteration, snapshot(ctx, 0, items, /*copy_cpu_tensors=*/true), std::move(json),
                  std::move(options));
  } else {
    save_checkpoint(ctx, root, state.iteration, items, json, options);
  }
  return bytes;
}

CheckpointPreview preview_checkpoint(const fs::path& root) {
  CheckpointReader reader = CheckpointReader::open(root);
  CheckpointPreview p;
  p.directory = reader.directory();
  p.iteration = reader.iteration();
  p.release = reader.is_release();
  p.state = reader.state();
  if (p.state.contains("rng") && p.state["rng"].contains("seed")) p.seed = p.state["rng"]["seed"].get<uint64_t>();
  return p;
}

LoadedTraining load_training_checkpoint(Context& ctx, CheckpointReader& reader, TrainingState& state,
                                        const train::CheckpointArguments& flags) {
  MEGATRON_CHECK(state.model != nullptr, "load_training_checkpoint: no model");
  const nlohmann::json& saved = reader.state();
  const nn::ModelConfig& config = state.model->config();
  std::vector<std::string> diffs = architecture_differences(saved.value("args", nlohmann::json::object()), config);
  if (!diffs.empty()) {
    std::string msg = str_cat("checkpoint ", reader.directory().string(), " was saved with another architecture (",
                              diffs.size(), diffs.size() == 1 ? " difference" : " differences", "):");
    for (const std::string& d : diffs) msg += "\n  - " + d;
    MEGATRON_FAIL(msg);
  }

  nn::ParameterList params = state.model->parameters();
  for (nn::Parameter* p : params) {
    // fp32 parameters take the fp32 master when the checkpoint has one (saved from a bf16/fp16 run): the
    // exact values the optimizer was updating, not their rounded copy.
    const bool exact = p->value.dtype() == DType::F32 && reader.has(kFp32Param + p->name);
    reader.load(ctx, whole_tensor(exact ? kFp32Param + p->name : p->name, dims(p->value), p->value.dtype()), p->value);
  }

  const bool weights_only = flags.finetune || reader.is_release();
  LoadedTraining out;
  if (!weights_only) {
    out.iteration = saved.value("iteration", reader.iteration());
    out.consumed_train_samples = saved.value("consumed_train_samples", int64_t(0));
    out.consumed_valid_samples = saved.value("consumed_valid_samples", int64_t(0));
  }
  optim::AdamW* opt = state.optimizer;
  const bool can_load_optim = !weights_only && !flags.no_load_optim && saved.contains("optimizer");
  if (opt != nullptr && can_load_optim) {
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::Parameter& p = *params[i];
      const std::vector<int64_t> shape = dims(p.value);
      if (opt->master(i).data_ptr() != p.value.data_ptr()) {
        // The fp32 master when the checkpoint has one; else (saved from fp32 parameters) the weights.
        const std::string key = reader.has(kFp32Param + p.name) ? kFp32Param + p.name : p.name;
        reader.load(ctx, whole_tensor(key, shape, opt->master(i).dtype()), opt->master(i));
      }
      reader.load(ctx, whole_tensor(kExpAvg + p.name, shape, opt->exp_avg(i).dtype()), opt->exp_avg(i));
      reader.load(ctx, whole_tensor(kExpAvgSq + p.name, shape, opt->exp_avg_sq(i).dtype()), opt->exp_avg_sq(i));
    }
    opt->set_step_count(saved["optimizer"].value("step", int64_t(0)));
    if (state.scheduler != nullptr && saved.contains("scheduler"))
      state.scheduler->set_num_steps(saved["scheduler"].value("num_steps", int64_t(0)));
    if (state.scaler != nullptr && saved.contains("loss_scaler")) {
      const auto& s = saved["loss_scaler"];
      state.scaler->load_state({s.value("scale", 1.0f), s.value("growth_tracker", int64_t(0)),
                                s.value("hysteresis_tracker", int64_t(0))});
    }
    out.optimizer_loaded = true;
  } else if (opt != nullptr) {
    opt->reload_model_params(ctx);  // masters from the loaded weights
  }
  out.bytes = reader.bytes_read();
  state.iteration = out.iteration;
  state.consumed_train_samples = out.consumed_train_samples;
  state.consumed_valid_samples = out.consumed_valid_samples;
  ctx.synchronize();
  return out;
}

}  // namespace megatron::checkpoint
