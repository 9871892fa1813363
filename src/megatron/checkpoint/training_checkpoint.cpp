#include "megatron/checkpoint/training_checkpoint.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <unordered_map>

#include "megatron/checkpoint/json_integer.h"
#include "megatron/checkpoint/sharded_tensor.h"
#include "megatron/core/error.h"
#include "megatron/core/progress.h"
#include "megatron/core/quoted_bytes.h"
#include "megatron/nn/parameter_shard.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"

namespace megatron::checkpoint {
namespace fs = std::filesystem;
namespace {

// Every parameter of every model chunk, in model order (or the state's own list).
nn::ParameterList model_parameters(const TrainingState& state) {
  if (!state.parameters.empty()) return state.parameters;
  nn::ParameterList all;
  for (nn::GPTModel* chunk : state.model)
    for (nn::Parameter* p : chunk->parameters()) all.push_back(p);
  return all;
}

}  // namespace

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
    "untie_embeddings_and_output_weights", "disable_bias_linear", "add_qkv_bias", "apply_layernorm_1p",
    "qk_layernorm",
};

}  // namespace

std::vector<std::pair<std::string, std::string>> architecture_values(const nn::TransformerConfig& config) {
  train::Arguments a;
  a.model = train::model_arguments(config);
  const auto all = train::argument_values(a);
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* key : kArchitectureKeys) out.emplace_back(key, value_of(all, key));
  if (config.position_embedding == nn::PositionEmbedding::LearnedAbsolute)
    out.emplace_back("max_position_embeddings", value_of(all, "max_position_embeddings"));
  // The real vocabulary: the padded one depends on TP, and a load resizes the padding rows.
  out.emplace_back("vocab_size", std::to_string(config.vocab_size));
  return out;
}

std::vector<std::string> architecture_differences(const nlohmann::json& saved_args, const nn::TransformerConfig& config) {
  std::vector<std::string> diffs;
  for (auto [key, value] : architecture_values(config)) {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (key == "vocab_size" && !saved_args.contains(key) && saved_args.contains("padded_vocab_size")) {
      // A checkpoint that records only the padded vocabulary: it must then be the same.
      key = "padded_vocab_size";
      value = std::to_string(config.padded_vocab_size);
      flag = "padded vocabulary size";
    }
    if (!saved_args.contains(key)) {
      // Checkpoints from before these flags had neither.
      if ((key == "add_qkv_bias" || key == "apply_layernorm_1p" || key == "qk_layernorm") && value == "False")
        continue;
      diffs.push_back(str_cat(flag, ": not in the checkpoint, this run ", value));
      continue;
    }
    const std::string saved = saved_args[key].get<std::string>();
    if (saved != value) diffs.push_back(str_cat(flag, ": checkpoint ", saved, ", this run ", value));
  }
  return diffs;
}

train::Arguments arguments_from_state(const nlohmann::json& state) {
  MEGATRON_CHECK(state.contains("args") && state["args"].is_object(), "checkpoint state has no saved args");
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& [key, value] : state["args"].items()) {
    // Only model and MoE flags (--num-experts, --moe-*): anything else (data paths, schedules, parallel
    // layout) is irrelevant to rebuilding the model. Empty values are flags left unset.
    if (!value.is_string() || value.get<std::string>().empty()) continue;
    bool is_model = false;
    for (const char* k : kArchitectureKeys) is_model = is_model || key == k;
    is_model = is_model || key == "max_position_embeddings" || key == "seq_length" || key == "vocab_size" ||
               key == "make_vocab_size_divisible_by" || key == "init_method_std" || key == "hidden_dropout" ||
               key == "attention_dropout" || key == "group_query_attention";
    const bool is_moe = key == "num_experts" || key.rfind("moe_", 0) == 0;
    if (is_model || is_moe) values.emplace_back(key, value.get<std::string>());
  }
  const train::Arguments parsed = train::parse_arguments(train::flags_for_values(values));
  train::Arguments out;
  out.model = parsed.model;
  out.moe = parsed.moe;
  return out;
}

ParameterPlacement tensor_parallel_placement(const nn::Parameter& p) {
  const nn::ParameterShard shard = nn::describe_shard(p);
  ParameterPlacement where;
  where.global_shape = shard.global_shape;
  for (const nn::ShardBox& b : shard.boxes)
    where.boxes.push_back(PlacementBox{b.local_start.empty() ? 0 : b.local_start[0], b.global_offset, b.shape,
                                       b.local_start});
  where.tp_replica = p.placement.replica_index();  // > 0: another rank's copy is saved
  where.expert = p.placement.expert;
  return where;
}

namespace {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

// A parameter's local tensor as box pieces of the whole parameter (its placement), checked against the local
// tensor. Box k holds the local tensor's flat elements [first[k], first[k] + boxes[k].numel()): each box is a
// contiguous run of the local tensor, and the boxes follow each other in local order.
struct Placed {
  std::vector<ShardSpec> boxes;  // key = parameter name, dtype = parameter dtype
  std::vector<int64_t> first;
  int tp_replica = 0;
  bool expert = false;
};

// Where box `b` starts in the local tensor (its local_start, or row local_row when that is empty).
std::vector<int64_t> local_start_of(const PlacementBox& b, size_t rank) {
  if (!b.local_start.empty()) return b.local_start;
  std::vector<int64_t> start(rank, 0);
  if (rank > 0) start[0] = b.local_row;
  return start;
}

Placed place_parameter(const TrainingState& state, const nn::Parameter& p) {
  const std::vector<int64_t> local = dims(p.value);
  const ParameterPlacement where = state.placement ? state.placement(p) : tensor_parallel_placement(p);
  Placed placed;
  placed.tp_replica = where.tp_replica;
  placed.expert = where.expert;
  MEGATRON_CHECK(where.tp_replica >= 0, "checkpoint: parameter '", p.name, "' has a negative tensor-parallel replica id");
  if (where.boxes.empty()) {
    MEGATRON_CHECK(where.global_shape.empty() || where.global_shape == local, "checkpoint: parameter '", p.name,
                   "' is ", dims_text(local), " here but its placement names no box of the whole ",
                   dims_text(where.global_shape));
    placed.boxes.push_back(whole_tensor(p.name, local, p.dtype()));
    placed.first.push_back(0);
    return placed;
  }
  int64_t next = 0;  // the local element the next box must start at
  for (const PlacementBox& b : where.boxes) {
    ShardSpec box = whole_tensor(p.name, where.global_shape, p.dtype());
    box.global_offset = b.global_offset;
    box.local_shape = b.shape;
    validate_shard(box);
    const std::vector<int64_t> start = local_start_of(b, local.size());
    bool inside = b.shape.size() == local.size() && start.size() == local.size();
    for (size_t d = 0; inside && d < local.size(); ++d) inside = start[d] >= 0 && start[d] + b.shape[d] <= local[d];
    const bool fits = local.empty() ? b.shape.empty() && next == 0
                                    : inside && nn::is_contiguous_run(b.shape, local) && nn::flat_index(start, local) == next;
    MEGATRON_CHECK(fits, "checkpoint: parameter '", p.name, "' (local ", dims_text(local), "): its placement box ",
                   box.describe(), " at local ", dims_text(start), " is not the next contiguous run (element ", next,
                   ") of the local tensor");
    placed.first.push_back(next);
    next += product(b.shape);
    placed.boxes.push_back(std::move(box));
  }
  MEGATRON_CHECK(next == product(local), "checkpoint: parameter '", p.name, "' has ", product(local),
                 " local elements but its placement boxes cover ", next);
  return placed;
}

std::vector<Placed> place_parameters(const TrainingState& state, const nn::ParameterList& params) {
  std::vector<Placed> out;
  for (const nn::Parameter* p : params) out.push_back(place_parameter(state, *p));
  return out;
}

// The pieces of parameter `placed` (or of its optimizer state under `key`, in `dtype`) that hold the local
// flat range [begin, end) (the whole local tensor: [0, numel)), each with the sub-range of [begin, end) it
// holds. A range inside one box is one piece (the box itself when the range covers it); a range crossing a box
// boundary (SwiGLU's fc1: from gate rows into up rows) is one flat piece per box.
struct LocalPiece {
  ShardSpec spec;
  int64_t begin = 0, end = 0;  // within [begin, end) of the request, relative to its begin
};
std::vector<LocalPiece> local_pieces(const Placed& placed, const std::string& key, DType dtype, int64_t begin,
                                     int64_t end, bool ranged) {
  std::vector<LocalPiece> out;
  for (size_t k = 0; k < placed.boxes.size(); ++k) {
    ShardSpec box = placed.boxes[k];
    box.key = key;
    box.dtype = dtype;
    const int64_t lo = std::max(begin, placed.first[k]), hi = std::min(end, placed.first[k] + box.numel());
    if (lo >= hi) continue;
    const bool whole_box = !ranged && lo == placed.first[k] && hi == placed.first[k] + box.numel();
    LocalPiece piece{whole_box ? box : flat_piece_of_box(box, lo - placed.first[k], hi - placed.first[k]),
                     lo - begin, hi - begin};
    out.push_back(std::move(piece));
  }
  return out;
}

// Elements [begin, end) of a tensor's flattening, as a 1-D view.
Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) { return t.view({t.numel()}).slice(begin, end); }

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

// The tensors with one row per (padded) vocabulary entry.
bool is_vocabulary_parameter(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

// Loads the piece `want` into `dst` (want.numel() elements). A vocabulary tensor whose checkpoint has another
// number of rows (another padded vocabulary: same real vocabulary, another TP or padding multiple) is resized:
// the piece's elements in rows the checkpoint has are loaded, the others (this model's extra padding rows) set
// to zero. Those elements are a prefix of the piece, since a box and a flat range of a box both run through
// the rows in order. Returns the checkpoint's row count when it resized, else -1.
int64_t load_piece(Context& ctx, CheckpointReader& reader, const ShardSpec& want, const Tensor& dst, bool vocabulary) {
  const TensorEntry& entry = reader.tensor(want.key);
  const std::vector<int64_t>& saved = entry.global_shape;
  const bool resize = vocabulary && saved.size() == want.global_shape.size() && !saved.empty() &&
                      saved[0] != want.global_shape[0] &&
                      std::equal(saved.begin() + 1, saved.end(), want.global_shape.begin() + 1);
  if (!resize) {
    reader.load(ctx, want, dst);  // refuses another global shape, naming the tensor
    return -1;
  }
  const int64_t saved_rows = saved[0];
  const int64_t row0 = want.global_offset[0], rows = want.local_shape[0];
  const int64_t row_elements = rows > 0 ? product(want.local_shape) / rows : 0;
  const int64_t keep_rows = std::clamp<int64_t>(saved_rows - row0, 0, rows);
  ShardSpec clipped = want;
  clipped.global_shape[0] = saved_rows;
  int64_t keep = 0;  // elements of the piece that exist in the checkpoint: the first `keep`
  if (keep_rows > 0) {
    clipped.local_shape[0] = keep_rows;
    if (want.flat) {
      clipped.flat_end = std::min(want.flat_end, keep_rows * row_elements);
      clipped.flat_begin = std::min(want.flat_begin, clipped.flat_end);
      keep = clipped.flat_end - clipped.flat_begin;
    } else {
      keep = keep_rows * row_elements;
    }
  }
  if (keep > 0) reader.load(ctx, clipped, keep == dst.numel() ? dst : flat_slice(dst, 0, keep));
  if (keep < dst.numel()) ops::fill(ctx, flat_slice(dst, keep, dst.numel()), 0.0);
  return saved_rows;
}

// FP8 delayed scaling's state of every linear the checkpoint has it for (a bf16 checkpoint has none: those
// linears start fresh, scale 1, as a new run). True when every FP8 linear's state was found.
bool load_fp8_state(Context& ctx, CheckpointReader& reader, const TrainingState& state) {
  bool all = true;
  for (const nn::GPTModel* chunk : state.model) {
    nn::Fp8ScalingState* fp8 = chunk->fp8_state().get();
    if (fp8 == nullptr || fp8->recipe().scaling != nn::Fp8Scaling::Delayed) continue;
    for (int i = 0; i < fp8->size(); ++i) {
      const std::string key = fp8->name(i) + kFp8ScalingSuffix;
      if (!reader.has(key)) {
        all = false;
        continue;
      }
      const std::vector<int64_t> saved = reader.tensor(key).global_shape;
      const int64_t len = fp8->recipe().amax_history_len;
      MEGATRON_CHECK((saved == std::vector<int64_t>{len + 2, 3}), "checkpoint ", reader.directory().string(), ": '",
                     key, "' holds an FP8 amax history of length ", saved.empty() ? 0 : saved[0] - 2,
                     " but this run has --fp8-amax-history-len ", len);
      Tensor packed = ctx.empty({len + 2, 3}, DType::F32);
      reader.load_whole(ctx, key, packed);
      fp8->unpack_linear_state(ctx, i, packed);
    }
  }
  return all;
}

// Refuses a checkpoint saved with another architecture, naming every flag that differs.
void check_same_architecture(const CheckpointReader& reader, const nlohmann::json& saved,
                             const nn::TransformerConfig& config) {
  std::vector<std::string> diffs = architecture_differences(saved.value("args", nlohmann::json::object()), config);
  if (!diffs.empty()) {
    std::string msg = str_cat("checkpoint ", reader.directory().string(), " was saved with another architecture (",
                              diffs.size(), diffs.size() == 1 ? " difference" : " differences", "):");
    for (const std::string& d : diffs) msg += "\n  - " + d;
    MEGATRON_FAIL(msg);
  }
}

// Loads the model's parameters, and their optimizer state, from the checkpoint's pieces.
struct ParameterLoader {
  Context& ctx;
  CheckpointReader& reader;
  const nn::ParameterList& params;
  const std::vector<Placed>& placed;  // params[i]'s placement
  LoadedTraining& out;                // records a vocabulary resized from another padding

  // Fills `dst` (elements [begin, end) of parameter i's local tensor, or of its optimizer state) from `key`.
  void operator()(size_t i, const std::string& key, const Tensor& dst, int64_t begin, int64_t end,
                  bool ranged) const {
    MEGATRON_CHECK(dst.numel() == end - begin, "load_training_checkpoint: '", key, "' holds ", dst.numel(),
                   " elements for the ", end - begin, " of its parameter's local range [", begin, ", ", end, ")");
    const bool vocabulary = is_vocabulary_parameter(params[i]->name);
    for (const LocalPiece& piece : local_pieces(placed[i], key, dst.dtype(), begin, end, ranged)) {
      const Tensor part = piece.begin == 0 && piece.end == dst.numel() ? dst : flat_slice(dst, piece.begin, piece.end);
      const int64_t saved_rows = load_piece(ctx, reader, piece.spec, part, vocabulary);
      if (saved_rows >= 0) out.resized_from_padded_vocab = saved_rows;
    }
  }
};

// Weights kept in FP8 (--fp8-param-gather) load into the distributed optimizer's masters of their ranges: the
// fp32 masters when the checkpoint has them, else the saved weights (any dtype). The trainer quantises them
// into the FP8 weights after the load (optim::DistributedOptimizer::requantize_fp8_params).
void load_fp8_weights_into_masters(const ParameterLoader& load_pieces, const TrainingState& state) {
  const nn::ParameterList& params = load_pieces.params;
  if (std::none_of(params.begin(), params.end(), [](const nn::Parameter* p) { return p->stored_in_fp8(); })) return;
  MEGATRON_CHECK(state.optimizer != nullptr && !state.optimizer_ranges.empty(), "load_training_checkpoint: the "
                 "model keeps weights in FP8, which load into the distributed optimizer's masters; none was given");
  const auto index = index_of(params);
  for (size_t k = 0; k < state.optimizer_ranges.size(); ++k) {
    const auto& r = state.optimizer_ranges[k];
    const size_t i = param_index(index, r.param);
    const nn::Parameter& p = *params[i];
    if (!p.stored_in_fp8()) continue;
    const std::string key = load_pieces.reader.has(kFp32Param + p.name) ? kFp32Param + p.name : p.name;
    load_pieces(i, key, state.optimizer->master(k), r.begin, r.end, true);
  }
}

// The optimizer's fp32 masters and moments (every entry: a whole parameter, or with the distributed
// optimizer its range), its step count, and the scheduler's and loss scaler's state where they exist.
void load_optimizer_state(const ParameterLoader& load_pieces, const nlohmann::json& saved, TrainingState& state) {
  optim::AdamW* opt = state.optimizer;
  CheckpointReader& reader = load_pieces.reader;
  const nn::ParameterList& params = load_pieces.params;
  const std::string field = (reader.directory() / kMetadataFile).string() + ": state.";
  // Entry k of the optimizer: parameter i whole (replicated optimizer) or its range [begin, end).
  const bool ranged = !state.optimizer_ranges.empty();
  MEGATRON_CHECK(opt->size() == (ranged ? state.optimizer_ranges.size() : params.size()),
                 "load_training_checkpoint: the optimizer holds ", opt->size(), " tensors but ",
                 ranged ? state.optimizer_ranges.size() : params.size(), ranged ? " parameter ranges" : " parameters");
  const auto index = index_of(params);
  for (size_t k = 0; k < opt->size(); ++k) {
    const size_t i = ranged ? param_index(index, state.optimizer_ranges[k].param) : k;
    const nn::Parameter& p = *params[i];
    const int64_t begin = ranged ? state.optimizer_ranges[k].begin : 0;
    const int64_t end = ranged ? state.optimizer_ranges[k].end : p.value.numel();
    const Tensor weights = ranged ? flat_slice(p.value, begin, end) : p.value;
    if (opt->master(k).data_ptr() != weights.data_ptr()) {
      // The fp32 master when the checkpoint has one; else (saved from fp32 parameters) the weights.
      const std::string key = reader.has(kFp32Param + p.name) ? kFp32Param + p.name : p.name;
      load_pieces(i, key, opt->master(k), begin, end, ranged);
    }
    load_pieces(i, kExpAvg + p.name, opt->exp_avg(k), begin, end, ranged);
    load_pieces(i, kExpAvgSq + p.name, opt->exp_avg_sq(k), begin, end, ranged);
  }
  opt->set_step_count(json_integer_or<int64_t>(saved["optimizer"], "step", 0, field + "optimizer."));
  if (state.scheduler != nullptr && saved.contains("scheduler")) {
    // The schedule counts samples; checkpoints written before it did (no "unit") counted iterations of
    // the run's global batch.
    const nlohmann::json& s = saved["scheduler"];
    int64_t steps = json_integer_or<int64_t>(s, "num_steps", 0, field + "scheduler.");
    MEGATRON_CHECK(steps >= 0, field, "scheduler.num_steps ", steps, " must not be negative");
    if (!s.contains("unit") && state.args != nullptr) {
      const int64_t gbs = std::max<int64_t>(1, state.args->training.global_batch_size);
      MEGATRON_CHECK(steps <= std::numeric_limits<int64_t>::max() / gbs, field, "scheduler.num_steps ", steps,
                     " iterations of ", gbs, " samples overflow the sample count");
      steps *= gbs;
    }
    state.scheduler->set_num_steps(steps);
  }
  if (state.scaler != nullptr && saved.contains("loss_scaler")) {
    const auto& s = saved["loss_scaler"];
    state.scaler->load_state({s.value("scale", 1.0f),
                              json_integer_or<int64_t>(s, "growth_tracker", 0, field + "loss_scaler."),
                              json_integer_or<int64_t>(s, "hysteresis_tracker", 0, field + "loss_scaler.")});
  }
}

// What decides an item's replica id: its copies over (expert) TP, and whether every rank of its data-parallel
// group -- DP x CP, or expert-DP for expert parameters -- holds it identically.
struct ItemReplicas {
  int tp_replica = 0;
  bool dp_replicated = false;
  bool expert = false;
};

// Replica ids: a piece every rank of its data-parallel group holds is written by the rank assign_writers picks
// in that group (expert pieces: among the expert-DP ranks); a piece every (expert) TP rank holds (tp_replica > 0
// here) by TP rank 0's writer only. Expert and dense pieces are spread separately, each over its own group.
void assign_replica_ids(std::vector<SaveItem>& items, const std::vector<ItemReplicas>& replicas,
                        const TrainingState& state) {
  for (const bool expert : {false, true}) {
    const int rank = expert ? state.expert_dp_rank : state.dp_rank, size = expert ? state.expert_dp_size : state.dp_size;
    std::vector<size_t> replicated;
    std::vector<uint64_t> bytes;
    for (size_t j = 0; j < items.size(); ++j) {
      if (replicas[j].expert != expert) continue;
      items[j].spec.replica_id = replicas[j].tp_replica * size;
      if (replicas[j].dp_replicated) {
        replicated.push_back(j);
        bytes.push_back(items[j].data.nbytes());
      }
    }
    const std::vector<int> writer = assign_writers(bytes, size);
    for (size_t n = 0; n < replicated.size(); ++n)
      items[replicated[n]].spec.replica_id += (rank - writer[n] + size) % size;
  }
}

}  // namespace

std::vector<SaveItem> training_save_items(const TrainingState& state, bool save_optim) {
  MEGATRON_CHECK(!state.model.empty(), "save_training_checkpoint: no model");
  MEGATRON_CHECK(state.dp_size >= 1 && state.dp_rank >= 0 && state.dp_rank < state.dp_size,
                 "save_training_checkpoint: data-parallel rank ", state.dp_rank, " of ", state.dp_size);
  MEGATRON_CHECK(state.expert_dp_size >= 1 && state.expert_dp_rank >= 0 && state.expert_dp_rank < state.expert_dp_size,
                 "save_training_checkpoint: expert-data-parallel rank ", state.expert_dp_rank, " of ",
                 state.expert_dp_size);
  const nn::ParameterList params = model_parameters(state);
  const std::vector<Placed> placed = place_parameters(state, params);
  std::vector<SaveItem> items;
  std::vector<ItemReplicas> replicas;  // per item
  auto add = [&](ShardSpec spec, Tensor data, const Placed& where, bool replicated) {
    items.push_back({std::move(spec), std::move(data)});
    replicas.push_back({where.tp_replica, replicated, where.expert});
  };
  const optim::AdamW* opt = save_optim ? state.optimizer : nullptr;
  // The pieces of local data `data` (elements [begin, end) of parameter i's local tensor) under `key`.
  // saved_as: the dtype the pieces are saved in when not data's (save_training_checkpoint converts them).
  auto add_pieces = [&](size_t i, const std::string& key, const Tensor& data, int64_t begin, int64_t end,
                        bool ranged, bool replicated, std::optional<DType> saved_as = std::nullopt) {
    MEGATRON_CHECK(data.numel() == end - begin, "save_training_checkpoint: '", key, "' holds ", data.numel(),
                   " elements for the ", end - begin, " of its parameter's local range [", begin, ", ", end, ")");
    for (LocalPiece& piece : local_pieces(placed[i], key, saved_as.value_or(data.dtype()), begin, end, ranged)) {
      const Tensor part = piece.begin == 0 && piece.end == data.numel() ? data : flat_slice(data, piece.begin, piece.end);
      add(std::move(piece.spec), part, placed[i], replicated);
    }
  };

  if (state.optimizer_ranges.empty()) {
    // Replicated optimizer: whole local tensors, identical on every DP rank.
    for (size_t i = 0; i < params.size(); ++i) {
      MEGATRON_CHECK(!params[i]->stored_in_fp8(), "save_training_checkpoint: ", params[i]->name, " is kept in FP8, "
                     "which only the distributed optimizer's ranges (optimizer_ranges) can save");
      add_pieces(i, params[i]->name, params[i]->value, 0, params[i]->value.numel(), false, true);
    }
    if (opt != nullptr) {
      MEGATRON_CHECK(opt->size() == params.size(), "save_training_checkpoint: the optimizer holds ", opt->size(),
                     " tensors but the model has ", params.size(), " parameters");
      for (size_t i = 0; i < params.size(); ++i) {
        const nn::Parameter& p = *params[i];
        const int64_t n = p.value.numel();
        if (opt->master(i).data_ptr() != p.value.data_ptr())
          add_pieces(i, kFp32Param + p.name, opt->master(i), 0, n, false, true);
        add_pieces(i, kExpAvg + p.name, opt->exp_avg(i), 0, n, false, true);
        add_pieces(i, kExpAvgSq + p.name, opt->exp_avg_sq(i), 0, n, false, true);
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
      const Tensor weights = flat_slice(p.value, r.begin, r.end);
      if (p.stored_in_fp8()) {
        // A weight kept in FP8 is saved as the parameter dtype it stands for, rounded from its master: what a
        // run without --fp8-param-gather saves, so either loads it.
        MEGATRON_CHECK(state.optimizer != nullptr, "save_training_checkpoint: ", p.name, " is kept in FP8; its "
                       "weights are saved from the optimizer's masters, but no optimizer was given");
        add_pieces(i, p.name, state.optimizer->master(k), r.begin, r.end, true, false, p.dtype());
      } else {
        add_pieces(i, p.name, weights, r.begin, r.end, true, false);
      }
      if (opt == nullptr) continue;
      if (opt->master(k).data_ptr() != weights.data_ptr())
        add_pieces(i, kFp32Param + p.name, opt->master(k), r.begin, r.end, true, false);
      add_pieces(i, kExpAvg + p.name, opt->exp_avg(k), r.begin, r.end, true, false);
      add_pieces(i, kExpAvgSq + p.name, opt->exp_avg_sq(k), r.begin, r.end, true, false);
    }
  }

  assign_replica_ids(items, replicas, state);
  return items;
}

std::vector<SaveItem> fp8_save_items(Context& ctx, const TrainingState& state) {
  std::vector<SaveItem> items;
  for (const nn::GPTModel* chunk : state.model) {
    const nn::Fp8ScalingState* fp8 = chunk->fp8_state().get();
    if (fp8 == nullptr || fp8->recipe().scaling != nn::Fp8Scaling::Delayed) continue;
    const int replica = chunk->tensor_parallel().rank() * state.dp_size + state.dp_rank;  // 0: the one writer
    for (int i = 0; i < fp8->size(); ++i) {
      Tensor packed = fp8->packed_linear_state(ctx, i);
      ShardSpec spec = whole_tensor(fp8->name(i) + kFp8ScalingSuffix, packed.shape().dims(), DType::F32);
      spec.replica_id = replica;
      items.push_back({std::move(spec), std::move(packed)});
    }
  }
  return items;
}

nlohmann::json training_state_json(const TrainingState& state, bool save_optim, bool save_rng) {
  MEGATRON_CHECK(!state.model.empty() && state.args != nullptr, "save_training_checkpoint: model and args required");
  const nn::TransformerConfig& config = state.model.front()->config();
  nlohmann::json j;
  j["iteration"] = state.iteration;
  j["consumed_train_samples"] = state.consumed_train_samples;
  j["consumed_valid_samples"] = state.consumed_valid_samples;
  nlohmann::json args = nlohmann::json::object();
  for (const auto& [k, v] : train::argument_values(*state.args)) args[k] = v;
  // The model's own view wins (e.g. a converted checkpoint's args are only the model's).
  train::Arguments model_only;
  model_only.model = train::model_arguments(config);
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
    if (state.scheduler != nullptr) j["scheduler"] = {{"num_steps", state.scheduler->num_steps()}, {"unit", "samples"}};
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
  bool converted = false;  // items that are temporaries made here (see the asynchronous save below)
  for (SaveItem& item : items)
    if (item.data.dtype() != item.spec.dtype) {  // a weight kept in FP8: its master, rounded to the saved dtype
      Tensor rounded = ctx.empty(item.data.shape(), item.spec.dtype);
      ops::cast(ctx, rounded, item.data);
      item.data = std::move(rounded);
      converted = true;
    }
  for (SaveItem& item : fp8_save_items(ctx, state)) {  // packed copies of the scaling state: temporaries too
    items.push_back(std::move(item));
    converted = true;
  }
  nlohmann::json json = training_state_json(state, save_optim, !flags.no_save_rng);
  SaveOptions options{.keep_last = flags.keep_last, .hooks = hooks};
  SaveReport report;
  for (const SaveItem& item : items)
    if (item.spec.replica_id == 0) report.bytes += item.data.nbytes();
  if (async != nullptr) {
    report.async = async->submit(ctx, root, state.iteration, items, std::move(json), std::move(options));
    // The rounded and packed copies above are freed when this returns, while the snapshot's copies may still read
    // them on their own stream: ctx's stream waits for those copies before it can reuse that memory.
    if (converted) async->order_before_update(ctx);
    // The optimizer's next step is the first work that modifies what the copies read.
    if (state.optimizer != nullptr)
      state.optimizer->before_next_update([async](Context& c) { async->order_before_update(c); });
  } else {
    save_checkpoint(ctx, root, state.iteration, items, json, options, world);
  }
  return report;
}

namespace {

LoadedTraining load_training_state(Context& ctx, CheckpointReader& reader, TrainingState& state,
                                   const train::CheckpointArguments& flags) {
  MEGATRON_CHECK(!state.model.empty(), "load_training_checkpoint: no model");
  const nlohmann::json& saved = reader.state();
  const std::string field = (reader.directory() / kMetadataFile).string() + ": state.";
  check_same_architecture(reader, saved, state.model.front()->config());

  const nn::ParameterList params = model_parameters(state);
  const std::vector<Placed> placed = place_parameters(state, params);
  LoadedTraining out;
  const ParameterLoader load_pieces{ctx, reader, params, placed, out};
  Progress progress("loading " + reader.directory().string(), int64_t(params.size()), "tensors");
  for (size_t i = 0; i < params.size(); ++i) {
    progress.update(int64_t(i));
    nn::Parameter* p = params[i];
    if (p->stored_in_fp8()) continue;  // into its masters, below
    // fp32 parameters take the fp32 master when the checkpoint has one (saved from a bf16/fp16 run): the
    // exact values the optimizer was updating, not their rounded copy.
    const bool exact = p->value.dtype() == DType::F32 && reader.has(kFp32Param + p->name);
    load_pieces(i, exact ? kFp32Param + p->name : p->name, p->value, 0, p->value.numel(), false);
  }
  progress.update(int64_t(params.size()));
  progress.done();
  load_fp8_weights_into_masters(load_pieces, state);

  const bool weights_only = flags.finetune || reader.is_release();
  if (!weights_only) out.fp8_state_loaded = load_fp8_state(ctx, reader, state);
  if (!weights_only) {
    out.iteration = json_integer_or<int64_t>(saved, "iteration", reader.iteration(), field);
    out.consumed_train_samples = json_integer_or<int64_t>(saved, "consumed_train_samples", 0, field);
    out.consumed_valid_samples = json_integer_or<int64_t>(saved, "consumed_valid_samples", 0, field);
  }
  optim::AdamW* opt = state.optimizer;
  const bool can_load_optim = !weights_only && !flags.no_load_optim && saved.contains("optimizer");
  if (opt != nullptr && can_load_optim) {
    load_optimizer_state(load_pieces, saved, state);
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

}  // namespace

namespace {

// Runs `read` on the saved state of the checkpoint in `dir`; a field of the wrong type (nlohmann's exceptions)
// becomes an error naming the file.
template <class Fn>
auto reading_state_of(const fs::path& dir, Fn&& read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint metadata ", (dir / kMetadataFile).string(), ": the saved state is malformed: ", e.what());
  }
}

}  // namespace

CheckpointPreview preview_checkpoint(const fs::path& root) {
  CheckpointReader reader = CheckpointReader::open(root);
  CheckpointPreview p;
  p.directory = reader.directory();
  p.iteration = reader.iteration();
  p.release = reader.is_release();
  p.state = reader.state();
  reading_state_of(p.directory, [&] {
    if (!p.state.contains("rng") || !p.state["rng"].contains("seed")) return;
    const nlohmann::json& seed = p.state["rng"]["seed"];
    MEGATRON_CHECK(seed.is_number_unsigned(), "checkpoint metadata ", (p.directory / kMetadataFile).string(),
                   ": state.rng.seed must be a non-negative integer, got ", quoted_bytes(seed.dump()));
    p.seed = seed.get<uint64_t>();
  });
  return p;
}

LoadedTraining load_training_checkpoint(Context& ctx, CheckpointReader& reader, TrainingState& state,
                                        const train::CheckpointArguments& flags) {
  return reading_state_of(reader.directory(), [&] { return load_training_state(ctx, reader, state, flags); });
}

}  // namespace megatron::checkpoint
