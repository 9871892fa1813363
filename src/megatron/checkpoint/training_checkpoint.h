// What a training checkpoint holds and how pretrain_gpt saves and resumes it, at any tensor- and
// data-parallel layout. Keys are global, so a layout only changes the ShardSpecs that training_save_items and
// load_training_checkpoint build:
//   - tensor parallelism (ParameterPlacement, from nn::describe_shard): a rank's local tensor of a parameter
//     is one or more boxes of the whole parameter (two for SwiGLU's fc1); each is saved and loaded as its own
//     piece; parameters every TP rank holds whole are written by TP rank 0's ranks only;
//   - replicated optimizer: every DP rank holds every tensor whole; assign_writers spreads the tensors over
//     the DP ranks (replica 0 on one of them), so each rank writes about 1/DP of the bytes;
//   - distributed optimizer (TrainingState::optimizer_ranges): each DP rank saves the ranges of each
//     parameter it updates -- weights, fp32 masters and moments -- as flat pieces; together the ranks cover
//     every tensor once;
//   - loading: every rank reads what it holds (its local weights, box by box; its optimizer entries: whole
//     local tensors, or its ranges cut at the box boundaries), from whatever pieces the checkpoint has
//     (sharded_tensor.h's rule).
//
// Tensors (keys are Megatron-core's state-dict names):
//   <param name>                               model weights, parameter dtype ("decoder.layers.0.mlp.linear_fc1.weight")
//   optimizer.state.fp32_param.<param name>    fp32 master (only for bf16/fp16 parameters), parameter's shape
//   optimizer.state.exp_avg.<param name>       Adam first moment (master dtype)
//   optimizer.state.exp_avg_sq.<param name>    Adam second moment
//   <linear name>.fp8_scaling                  FP8 delayed scaling's state of an FP8 linear, F32 [L + 2, 3]
//                                              (nn::Fp8ScalingState::packed_linear_state); a checkpoint without it
//                                              (bf16) loads into an FP8 run with fresh scales, and an FP8
//                                              checkpoint loads into a bf16 run ignoring it
// State (metadata.json "state"):
//   iteration, consumed_train_samples, consumed_valid_samples,
//   args {flag key: value} (the resolved configuration, plus padded_vocab_size and params_dtype),
//   optimizer {step, beta1, beta2, eps} and scheduler {num_steps} and loss_scaler {scale, growth_tracker,
//   hysteresis_tracker} (with the optimizer), rng {seed, generator} (dropout and init are Philox addressed by
//   (seed, offset) and the offsets derive from the iteration, so the seed is the whole RNG state).
//
// Loading (Megatron's rules): --finetune or a "release" checkpoint loads the weights only and starts at
// iteration 0 with fresh optimizer, schedule and data position; --no-load-optim skips the optimizer, its
// schedule and the loss scaler (the fp32 masters are then rebuilt from the loaded weights); --no-load-rng
// keeps --seed. The architecture must match: architecture_differences() lists every argument that differs.
// The vocabulary is compared by its real size (vocab_size): the padded size depends on TP
// (make_vocab_size_divisible_by x TP), so a checkpoint whose padded vocabulary differs still loads: the rows of
// the word embedding and output layer (weights, fp32 masters, moments) that exist in both are loaded, this
// model's extra padding rows start at zero, padding rows only the checkpoint has are dropped (the logits cover
// the padded vocabulary, so the loss then differs slightly from the saved run's: LoadedTraining reports it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/checkpoint/async_saver.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/shard_writer.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/optim/adamw.h"
#include "megatron/optim/distributed_optimizer.h"
#include "megatron/optim/loss_scaler.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/train/arguments.h"

namespace megatron::checkpoint {

// Where a rank's local tensor of a parameter sits in the whole parameter: what a tensor-parallel layer
// reports (docs/checkpoint.md, "Tensor-parallel runs"). The local tensor is made of one or more
// boxes of the whole parameter, each a range of its rows (dimension 0) with every other dimension whole in the
// local tensor: a plain split is one box (a row block, a column block, or the whole tensor), SwiGLU's fc1 under
// tensor parallelism is two ([gate_r; up_r]). Contract (checked by the checkpoint code, which names the
// parameter): the boxes lie inside global_shape, come in local row order, and their rows add up to the local
// tensor's rows; each box's extent in the other dimensions equals the local tensor's.
// A box may also start inside a row (local_start: expert parameters, whose boxes are runs such as one
// expert's gate rows [1, F/ETP, h] of a local [E/EP, 2F/ETP, h]); the general contract is that each box is a
// contiguous run of the local tensor's row-major flattening and the boxes follow each other without gaps.
struct PlacementBox {
  int64_t local_row = 0;               // first row of the box in the local tensor
  std::vector<int64_t> global_offset;  // where the box starts in the whole parameter, per dimension
  std::vector<int64_t> shape;          // its extent per dimension
  std::vector<int64_t> local_start{};  // where it starts in the local tensor, per dimension; empty: [local_row, 0...]
};
struct ParameterPlacement {
  std::vector<int64_t> global_shape;  // the whole parameter
  std::vector<PlacementBox> boxes;    // empty: the local tensor is the whole parameter
  // 0 on the one rank of the model-parallel group that saves these boxes; > 0 on ranks holding an identical
  // copy (nn::Placement::replica_index: parameters every TP rank holds whole -- norms, row-parallel biases,
  // position embeddings -- and a pipeline's last-stage copy of tied word embeddings).
  int tp_replica = 0;
  // An expert parameter: tp_replica counts copies over expert TP, and the copies over the expert-data-parallel
  // group (not DP x CP) are the ones assign_writers spreads.
  bool expert = false;
};
// The placement of a model parameter from its tensor-parallel split (nn::describe_shard): the default of
// TrainingState::placement. At TP = 1 it is the whole tensor with tp_replica 0.
ParameterPlacement tensor_parallel_placement(const nn::Parameter& p);
using ParameterPlacementFn = std::function<ParameterPlacement(const nn::Parameter&)>;

struct TrainingState {
  // This rank's model chunks (one without virtual pipeline stages; a pipeline rank holds its stages' layers,
  // named by global layer number); required.
  std::vector<nn::GPTModel*> model;
  // The AdamW in use: the replicated optimizer (entry i = parameter i, whole) or the distributed
  // optimizer's (DistributedOptimizer::adamw(), entry i = optimizer_ranges[i]). Optional (converted
  // checkpoints have none).
  optim::AdamW* optimizer = nullptr;
  // Distributed optimizer: what each optimizer entry holds (DistributedOptimizer::param_ranges()).
  std::vector<optim::DistributedOptimizer::ParamRange> optimizer_ranges{};
  int dp_rank = 0, dp_size = 1;  // this rank in its data-parallel group (ranks with the same TP rank)
  int expert_dp_rank = 0, expert_dp_size = 1;  // this rank in its expert-data-parallel group (expert parameters)
  // The parameters saved and loaded, in model order; empty: every chunk's parameters. Tests use it to add
  // synthetic parameters to a model.
  nn::ParameterList parameters{};
  // Where each parameter's local tensor sits in the whole one; empty: tensor_parallel_placement (what the
  // model's tensor-parallel splits say). Tests override it to describe synthetic layouts.
  ParameterPlacementFn placement{};
  optim::OptimizerParamScheduler* scheduler = nullptr;
  optim::LossScaler* scaler = nullptr;
  const train::Arguments* args = nullptr;             // required for saving
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
};

// The (key, value) pairs that must agree between a checkpoint and the model that loads it.
std::vector<std::pair<std::string, std::string>> architecture_values(const nn::TransformerConfig& config);
// "--hidden-size: checkpoint 64, this run 128" for every architecture value that differs or is missing.
std::vector<std::string> architecture_differences(const nlohmann::json& saved_args, const nn::TransformerConfig& config);
// The model and MoE arguments rebuilt from a checkpoint's saved args (generate, convert_checkpoint); the other
// groups keep their defaults.
train::Arguments arguments_from_state(const nlohmann::json& state);

// This rank's pieces, with their replica ids (replicas are kept in the list; the snapshot drops them).
std::vector<SaveItem> training_save_items(const TrainingState& state, bool save_optim);
// The FP8 scaling state's pieces (device copies made on ctx's stream), written by TP rank 0 of DP rank 0.
std::vector<SaveItem> fp8_save_items(Context& ctx, const TrainingState& state);
inline constexpr const char* kFp8ScalingSuffix = ".fp8_scaling";
nlohmann::json training_state_json(const TrainingState& state, bool save_optim, bool save_rng);

struct SaveReport {
  uint64_t bytes = 0;  // tensor bytes this rank saves (its replica-0 pieces)
  std::optional<AsyncSaver::Submitted> async;  // with an AsyncSaver: where submit()'s time went
};
// Saves at state.iteration under `root`; collective over `world` (nullptr: a world of one), each rank
// with its own state. With `async` (whose world must be the same) the snapshot is staged here, the write
// happens on its background thread and the next optimizer step waits for the staging copies
// (AdamW::before_next_update: `async` must outlive the optimizer's next step(), or the optimizer); without,
// the checkpoint is published when this returns. With the
// distributed optimizer and --overlap-param-gather, the caller first makes ctx's stream wait for the
// parameter all-gathers (DistributedOptimizer::finish_param_gather): the snapshot reads the parameters.
SaveReport save_training_checkpoint(Context& ctx, const std::filesystem::path& root, const TrainingState& state,
                                    const train::CheckpointArguments& flags, AsyncSaver* async,
                                    const SaveHooks& hooks = {}, comm::Communicator* world = nullptr);

// What a checkpoint says about the run, read before the model is built (its seed decides dropout).
struct CheckpointPreview {
  std::filesystem::path directory;
  int64_t iteration = 0;
  bool release = false;
  std::optional<uint64_t> seed;  // when the checkpoint saved its RNG state
  nlohmann::json state;
};
CheckpointPreview preview_checkpoint(const std::filesystem::path& root);

struct LoadedTraining {
  int64_t iteration = 0;  // where training resumes (0 with --finetune / release)
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  bool optimizer_loaded = false;
  uint64_t bytes = 0;  // tensor data read
  // The checkpoint's padded vocabulary when it differs from the model's (rows resized as above); 0 when equal.
  int64_t resized_from_padded_vocab = 0;
  bool fp8_state_loaded = false;  // every FP8 linear's scaling state came from the checkpoint
};
// Loads into state.model's chunks (and optimizer/scheduler/scaler per the flags). Throws before touching anything
// when the architecture differs, listing every difference. With several ranks each calls it with its own
// state and reader (no communication): it reads the pieces it holds, whatever layout saved them.
LoadedTraining load_training_checkpoint(Context& ctx, CheckpointReader& reader, TrainingState& state,
                                        const train::CheckpointArguments& flags);

}  // namespace megatron::checkpoint
