// What a training checkpoint holds and how pretrain_gpt saves and resumes it (world size 1 today; every
// tensor is one whole piece, and the keys are global, so TP/DP/distributed-optimizer layouts only change
// the ShardSpecs that training_save_items and load_training_checkpoint build).
//
// Tensors (keys are Megatron-core's state-dict names):
//   <param name>                               model weights, parameter dtype ("decoder.layers.0.mlp.linear_fc1.weight")
//   optimizer.state.fp32_param.<param name>    fp32 master (only for bf16/fp16 parameters), parameter's shape
//   optimizer.state.exp_avg.<param name>       Adam first moment (master dtype)
//   optimizer.state.exp_avg_sq.<param name>    Adam second moment
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
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/checkpoint/async_saver.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/shard_writer.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/optim/adamw.h"
#include "megatron/optim/loss_scaler.h"
#include "megatron/optim/lr_scheduler.h"
#include "megatron/train/arguments.h"

namespace megatron::checkpoint {

struct TrainingState {
  nn::GPTModel* model = nullptr;                      // required
  optim::AdamW* optimizer = nullptr;                  // optional (converted checkpoints have none)
  optim::OptimizerParamScheduler* scheduler = nullptr;
  optim::LossScaler* scaler = nullptr;
  const train::Arguments* args = nullptr;             // required for saving
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
};

// The (key, value) pairs that must agree between a checkpoint and the model that loads it.
std::vector<std::pair<std::string, std::string>> architecture_values(const nn::ModelConfig& config);
// "--hidden-size: checkpoint 64, this run 128" for every architecture value that differs or is missing.
std::vector<std::string> architecture_differences(const nlohmann::json& saved_args, const nn::ModelConfig& config);
// Model arguments rebuilt from a checkpoint's saved args (generate, convert_checkpoint).
train::ModelArguments model_arguments_from_state(const nlohmann::json& state);

std::vector<SaveItem> training_save_items(const TrainingState& state, bool save_optim);
nlohmann::json training_state_json(const TrainingState& state, bool save_optim, bool save_rng);

// Saves at state.iteration under `root`. With `async` the write happens on its background thread (the
// snapshot is taken here); without, it completes before returning. Returns the bytes of tensor data saved.
uint64_t save_training_checkpoint(Context& ctx, const std::filesystem::path& root, const TrainingState& state,
                              const train::CheckpointArguments& flags, AsyncSaver* async,
                              const SaveHooks& hooks = {});

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
};
// Loads into state.model (and optimizer/scheduler/scaler per the flags). Throws before touching anything
// when the architecture differs, listing every difference.
LoadedTraining load_training_checkpoint(Context& ctx, CheckpointReader& reader, TrainingState& state,
                                        const train::CheckpointArguments& flags);

}  // namespace megatron::checkpoint
