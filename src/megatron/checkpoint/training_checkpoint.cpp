#include "megatron/checkpoint/training_checkpoint.h"

#include <algorithm>
#include <unordered_map>

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

namespace {

// Each parameter's box (its place in the whole parameter) and TP replica number, checked against the
// local tensor.
struct Placed {
  ShardSpec box;  // key = parameter name, dtype = parameter dtype
  int tp_replica = 0;
};
std::vector<Placed> place_parameters(const TrainingState& state, const nn::ParameterList& params) {
  std::vector<Placed> out;
  for (const nn::Parameter* p : params) {
    Placed placed;
    placed.box = whole_tensor(p->name, dims(p->value), p->value.dtype());
    if (state.placement) {
      const ParameterPlacement where = state.placement(*p);
      placed.box.global_shape = where.global_shape;
      placed.box.global_offset = where.global_offset;
      placed.tp_replica = where.tp_replica;
      validate_shard(placed.box);
    }
    out.push_back(std::move(placed));
  }
  return out;
}

// The box of parameter `placed` under another key and dtype (its optimizer state).
ShardSpec box_as(const Placed& placed, const std::string& key, DType dtype) {
  ShardSpec s = placed.box;
  s.key = key;
  s.dtype = dtype;
  return s;
}

std::unordered_map<const nn::Parameter*, size_t> index_of(const nn::ParameterList& params) {
  std::unordered_map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]] = i;
  return index;
}

size_t param_index(const std::unordered_map<const nn::Parameter*, size_t>& index, const nn::Parameter* p) {
  auto it = index.find(p);
  MEGATRON_CHECK(it != index.end(), "checkpoint: the distributed optimizer holds a range of parameter '",
                 p != nullptr ? p->name : std::string("null"), "', which is not one of the model's parameters");
  return it->second;
}

}  // namespace

std::vector<SaveItem> training_save_items(const TrainingState& state, bool save_optim) {
  MEGATRON_CHECK(state.model != nullptr, "save_training_checkpoint: no model");
  MEGATRON_CHECK(state.dp_size >= 1 && state.dp_rank >= 0 && state.dp_rank < state.dp_size,
                 "save_training_checkpoint: data-parallel rank ", state.dp_rank, " of ", state.dp_size);
  const nn::ParameterList params = state.model->parameters();
  const std::vector<Placed> placed = place_parameters(state, params);
  std::vector<SaveItem> items;
  std::vector<int> tp_replica;     // per item
  std::vector<bool> dp_replicated;  // per item: every DP rank holds it identically
  auto add = [&](ShardSpec spec, Tensor data, int tp_rep, bool replicated) {
    items.push_back({std::move(spec), std::move(data)});
    tp_replica.push_back(tp_rep);
    dp_replicated.push_back(replicated);
  };
  const optim::AdamW* opt = save_optim ? state.optimizer : nullptr;

  if (state.optimizer_ranges.empty()) {
    // Replicated optimizer: whole local tensors, identical on every DP rank.
    for (size_t i = 0; i < params.size(); ++i) add(placed[i].box, params[i]->value, placed[i].tp_replica, true);
    if (opt != nullptr) {
      MEGATRON_CHECK(opt->size() == params.size(), "save_training_checkpoint: the optimizer holds ", opt->size(),
                     " tensors but the model has ", params.size(), " parameters");
      for (size_t i = 0; i < params.size(); ++i) {
        const nn::Parameter& p = *params[i];
        const int rep = placed[i].tp_replica;
        if (opt->master(i).data_ptr() != p.value.data_ptr())
          add(box_as(placed[i], kFp32Param + p.name, opt->master(i).dtype()), opt->master(i), rep, true);
        add(box_as(placed[i], kExpAvg + p.name, opt->exp_avg(i).dtype()), opt->exp_avg(i), rep, true);
        add(box_as(placed[i], kExpAvgSq + p.name, opt->exp_avg_sq(i).dtype()), opt->exp_avg_sq(i), rep, true);
      }
    }
  } else {
    // Distributed optimizer: this rank's ranges of each parameter -- the weights it updated (its own values,
    // not the all-gathered copies of the other ranks'), their fp32 masters and moments.
    const auto index = index_of(params);
    MEGATRON_CHECK(state.optimizer == nullptr || state.optimizer->size() == state.optimizer_ranges.size(),
                   "save_training_checkpoint: the distributed optimizer holds ",
                   state.optimizer ? state.optimizer->size() : 0, " tensors but ", state.optimizer_ranges.size(),
                   " parameter ranges");
    for (size_t k = 0; k < state.optimizer_ranges.size(); ++k) {
      const auto& r = state.optimizer_ranges[k];
      const size_t i = param_index(index, r.param);
      const nn::Parameter& p = *params[i];
      const int rep = placed[i].tp_replica;
      const Tensor weights = p.value.view({p.value.numel()}).slice(r.begin, r.end);
      add(flat_piece_of_box(placed[i].box, r.begin, r.end), weights, rep, false);
      if (opt == nullptr) continue;
      auto range_of = [&](const std::string& key, const Tensor& t) {
        return flat_piece_of_box(box_as(placed[i], key, t.dtype()), r.begin, r.end);
      };
      if (opt->master(k).data_ptr() != weights.data_ptr())
        add(range_of(kFp32Param + p.name, opt->master(k)), opt->master(k), rep, false);
      add(range_of(kExpAvg + p.name, opt->exp_avg(k)), opt->exp_avg(k), rep, false);
      add(range_of(kExpAvgSq + p.name, opt->exp_avg_sq(k)), opt->exp_avg_sq(k), rep, false);
    }
  }

  // Replica ids: a piece every DP rank holds is written by the DP rank assign_writers picks; a piece every
  // TP rank holds (tp_replica > 0 here) by TP rank 0's writer only.
  std::vector<size_t> replicated;
  std::vector<uint64_t> bytes;
  for (size_t j = 0; j < items.size(); ++j)
    if (dp_replicated[j]) {
      replicated.push_back(j);
      bytes.push_back(items[j].data.nbytes());
    }
  const std::vector<int> writer = assign_writers(bytes, state.dp_size);
  for (size_t j = 0; j < items.size(); ++j) items[j].spec.replica_id = tp_replica[j] * state.dp_size;
  for (size_t n = 0; n < replicated.size(); ++n)
    items[replicated[n]].spec.replica_id += (state.dp_rank - writer[n] + state.dp_size) % state.dp_size;
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

SaveReport save_training_checkpoint(Context& ctx, const fs::path& root, const TrainingState& state,
                                    const train::CheckpointArguments& flags, AsyncSaver* async, const SaveHooks& hooks,
                                    comm::Communicator* world) {
  const bool save_optim = !flags.no_save_optim;
  std::vector<SaveItem> items = training_save_items(state, save_optim);
  nlohmann::json json = training_state_json(state, save_optim, !flags.no_save_rng);
  SaveOptions options{.keep_last = flags.keep_last, .hooks = hooks};
  SaveReport report;
  for (const SaveItem& item : items)
    if (item.spec.replica_id == 0) report.bytes += item.data.nbytes();
  if (async != nullptr) {
    report.async = async->submit(ctx, root, state.iteration, items, std::move(json), std::move(options));
    // The optimizer's next step is the first work that modifies what the copies read.
    if (state.optimizer != nullptr)
      state.optimizer->before_next_update([async](Context& c) { async->order_before_update(c); });
  } else {
    save_checkpoint(ctx, root, state.iteration, items, json, options, world);
  }
  return report;
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

  const nn::ParameterList params = state.model->parameters();
  const std::vector<Placed> placed = place_parameters(state, params);
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = params[i];
    // fp32 parameters take the fp32 master when the checkpoint has one (saved from a bf16/fp16 run): the
    // exact values the optimizer was updating, not their rounded copy.
    const bool exact = p->value.dtype() == DType::F32 && reader.has(kFp32Param + p->name);
    reader.load(ctx, box_as(placed[i], exact ? kFp32Param + p->name : p->name, p->value.dtype()), p->value);
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
    // Entry k of the optimizer: parameter i whole (replicated optimizer) or its range [begin, end).
    const bool ranged = !state.optimizer_ranges.empty();
    MEGATRON_CHECK(opt->size() == (ranged ? state.optimizer_ranges.size() : params.size()),
                   "load_training_checkpoint: the optimizer holds ", opt->size(), " tensors but ",
                   ranged ? state.optimizer_ranges.size() : params.size(), ranged ? " parameter ranges" : " parameters");
    const auto index = index_of(params);
    for (size_t k = 0; k < opt->size(); ++k) {
      const size_t i = ranged ? param_index(index, state.optimizer_ranges[k].param) : k;
      const nn::Parameter& p = *params[i];
      auto piece = [&](const std::string& key, const Tensor& t) {
        const ShardSpec box = box_as(placed[i], key, t.dtype());
        return ranged ? flat_piece_of_box(box, state.optimizer_ranges[k].begin, state.optimizer_ranges[k].end) : box;
      };
      const Tensor weights = ranged ? p.value.view({p.value.numel()}).slice(state.optimizer_ranges[k].begin,
                                                                            state.optimizer_ranges[k].end)
                                    : p.value;
      if (opt->master(k).data_ptr() != weights.data_ptr()) {
        // The fp32 master when the checkpoint has one; else (saved from fp32 parameters) the weights.
        const std::string key = reader.has(kFp32Param + p.name) ? kFp32Param + p.name : p.name;
        reader.load(ctx, piece(key, opt->master(k)), opt->master(k));
      }
      reader.load(ctx, piece(kExpAvg + p.name, opt->exp_avg(k)), opt->exp_avg(k));
      reader.load(ctx, piece(kExpAvgSq + p.name, opt->exp_avg_sq(k)), opt->exp_avg_sq(k));
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
