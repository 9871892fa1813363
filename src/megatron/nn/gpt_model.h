// GPTModel: Megatron's GPT (embedding -> L pre-norm transformer layers -> final norm -> output layer ->
// cross-entropy with a loss mask), built as a stage: a range of layers with their global numbers, plus the
// two roles Megatron calls pre_process (the embedding) and post_process (final norm, output layer, loss).
// The whole model is the stage holding every layer and both roles (StageLayout's default); a pipeline
// splits it into stages whose layers keep their global numbers, so parameter names, initial values, dropout
// masks and checkpoint keys are the same at every layout.
//
// Activations belong to the micro-batch. forward() returns a StageOutput whose `saved` (StageSaved) is
// everything the backward needs; the model keeps only parameters, configuration and workspace, so any
// number of micro-batches can be between their forward and their backward, in any order. backward()
// consumes the StageSaved and frees it layer by layer as it goes; dropping one unused (evaluation) frees it.
//
// forward(ctx, input, options):
//   input.tokens [b, s] I32/I64 on the first stage (pre_process); otherwise input.hidden, the previous
//   stage's output: [b * s, h] (this rank's token rows [b * s / TP, h] under sequence parallelism, Megatron's
//   hidden-state layout at layer boundaries), with input.batch and input.seq giving b and s.
//   input.labels [b, s] and input.loss_mask [b, s] F32 on the last stage (post_process).
//   Returns, on the last stage, `loss` = sum(loss * mask) / sum(mask) as a device scalar (stats dtype, [1];
//   Megatron's per-micro-batch loss, nothing synchronised) -- or without labels `logits` [b * s, V / TP]
//   (this rank's vocabulary columns; generation) -- and on other stages `hidden`, the output hidden state
//   shaped like input.hidden. Without options.training nothing is kept for a backward: each layer's
//   activations are freed as soon as the next layer has read them.
//   options.kv_caches (generation, TP = 1): one KvCache per layer of the stage; the tokens are the next s of
//   each sequence, at positions options.position .. + s - 1 (learned positions and RoPE alike).
//   options.training: hidden/embedding dropout on, with Philox offsets derived from options.dropout_step,
//   which must differ for every micro-batch of every iteration; and, on the last stage, the loss gradient:
//   the gradient of grad_scale * sum(loss * mask) / loss_denominator (loss_denominator 0: sum(mask), read
//   from the device, one synchronisation) is known before the forward, so the fused cross-entropy leaves
//   dlogits in the saved state in the same pass. An all-zero mask contributes no gradient.
// backward(ctx, saved, doutput, hooks): doutput is the gradient of `hidden` (non-last stages; ignored on the
//   last, whose gradient comes from the loss). Accumulates (+=) into every parameter's main_grad and returns
//   the gradient of input.hidden (undefined on the first stage). Zeroing main grads is the caller's.
// forward_backward / forward_loss: the whole model on one micro-batch (tests, tools), returning the loss on
//   the host (one synchronisation).
//
// Tied embeddings (the default): the output layer multiplies by embedding.word_embeddings' value and adds
// its gradient into that parameter's main_grad; parameters() lists it once. A last stage without the
// embedding keeps its own copy of the word embeddings as the output weight (same name and initial values;
// placement.shared_embedding_copy), whose gradient the pipeline sums with the first stage's. Untied:
// "output_layer.weight" [padded V, h], normal(0, init_method_std), no bias. Logits cover the padded
// vocabulary (as in Megatron). Activations are in the parameter dtype; norm statistics, softmax/LSE and the
// loss are F32 (F64 for F64).
//
// Tensor parallelism (a TensorParallel of size TP > 1, parallel/tensor_parallel.h): the word embeddings (and
// the output layer, tied or not) are split by vocabulary rows, attention by query groups, the MLP by ffn
// columns (docs/parallelism.md); the loss is the vocabulary-parallel cross-entropy (no logits gathered), so
// every TP rank returns the same loss, and each rank's gradients are its pieces of the TP = 1 gradients (up to
// reduction order). With sequence parallelism the norms, dropout and residual stream hold this rank's token
// rows, and the norms' gradients are partial sums (placement.grad_partial_over_tp) that finalize_model_grads
// completes. Every parameter records its placement (placement.h), and its initial values are its piece of
// the TP = 1 initialisation, so TP = N is the TP = 1 function.
//
// Context parallelism (a ContextParallel of size CP > 1, parallel/context_parallel.h): input.tokens, labels,
// loss_mask and hidden hold this rank's S / CP tokens of each sequence (chunks r and 2CP-1-r; input.seq is
// that local length); positions, RoPE angles and dropout masks follow the tokens' original positions, and
// the attention cores communicate over the CP group. The loss is this rank's masked mean: Megatron's
// per-rank loss, whose gradients the data-parallel reduction over DP x CP averages. Parameters are
// replicated over CP (placement unchanged), so CP = N computes the CP = 1 function.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "megatron/nn/embedding.h"
#include "megatron/nn/linear.h"
#include "megatron/nn/norm.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/nn/transformer_layer.h"

namespace megatron::nn {

// Data-parallel hooks (distributed/, optim/distributed_optimizer.h); empty = none. Each call names the
// parameters of one module group: the embedding, one transformer layer, or the final norm with the output
// layer -- for the uses (before_/after_ hooks) the weight the logits are computed with, the tied word
// embeddings included.
//   before_forward(params):  forward is about to read their values (the distributed optimizer waits for their
//                            all-gather here; FSDP gathers them);
//   after_forward(params):   that forward has read them (FSDP may drop the gathered values);
//   before_recompute(params), after_recompute(params): the same around a forward repeated inside backward (full
//                            recomputation), whose layers' backward follows; unset: before_/after_forward are
//                            called (FSDP keeps the values for that backward and prefetches nothing forward);
//   before_backward(params): backward is about to read their values and accumulate into their main_grads;
//   after_backward(params):  it has (FSDP reduces this pass's gradients);
//   grads_final(params):     backward has finished accumulating into their main_grads for this iteration's
//                            last pass (each parameter once: the tied word embeddings after the embedding's
//                            backward).
struct ParamHooks {
  std::function<void(const ParameterList&)> before_forward;
  std::function<void(const ParameterList&)> after_forward;
  std::function<void(const ParameterList&)> before_recompute;
  std::function<void(const ParameterList&)> after_recompute;
  std::function<void(const ParameterList&)> before_backward;
  std::function<void(const ParameterList&)> after_backward;
  std::function<void(const ParameterList&)> grads_final;
};

// The layers [first_layer, first_layer + num_layers) (global numbers) and the roles of one stage.
struct StageLayout {
  int first_layer = 0;
  int num_layers = -1;        // -1: every layer from first_layer on
  bool pre_process = true;    // the embedding
  bool post_process = true;   // final norm, output layer, loss
};

struct StageInput {
  Tensor tokens;               // first stage: [b, s]
  Tensor hidden;               // other stages: the previous stage's output
  int64_t batch = 0, seq = 0;  // b and s (taken from tokens when given)
  Tensor labels, loss_mask;    // last stage: [b, s]
  // Documents inside the rows (trainer/micro_batch.h), on every stage that has them: position_ids [b, s] I64 on
  // the device (--reset-position-ids: positions restart after each EOD; learned positions and RoPE use them),
  // cu_seqlens host I64 [N + 1] (--reset-attention-mask: the documents of the b whole rows as offsets into
  // their b * S tokens; attention stays inside each).
  Tensor position_ids, cu_seqlens;
};

struct ForwardOptions {
  bool training = true;
  uint64_t dropout_step = 0;      // selects this pass's dropout masks
  double grad_scale = 1.0;        // last stage, training: gradients are of grad_scale * sum(loss * mask) / denominator
  double loss_denominator = 0.0;  // 0: sum(loss_mask) of this micro-batch, read from the device (one sync)
  ParamHooks hooks = {};          // before_forward is called here (grads_final goes to backward())
  std::vector<KvCache>* kv_caches = nullptr;  // generation: one per layer of the stage
  int64_t position = 0;                       // generation: the first new token's position
  Timers* timers = nullptr;                   // level-2 timers inside the layers (MoE token exchange; null: none)
};

// What the output layer and loss leave for the backward.
struct HeadSaved {
  NormSaved final_norm;
  Tensor final_hidden;  // the final norm's output, the output layer's input
  Tensor dlogits;       // [T, V / TP]: the loss gradient's logits gradient (training only)
};

// Full recomputation's record of one unit of layers: its input hidden state and the passes its layers ran
// with; the backward runs their forwards again from these (recompute.h). The input is kept as one tensor, the
// sum residual + branch that the first layer's input norm formed (and normalised: feeding it back unsplit
// gives that norm the same rounded sum, and the gradient of a sum is that of each of its parts).
struct RecomputedLayers {
  size_t first = 0;                 // the unit's first layer (index in the stage)
  Tensor input;                     // undefined once recomputed; distributed: this TP rank's 1/TP of it, flat
  Shape input_shape;                // distributed: the whole input's
  std::vector<LayerPass> passes;    // one per layer of the unit
};

// One micro-batch's activations in a stage. Move-only: it is consumed by exactly one backward (a copy would
// let a second backward accumulate the same gradients again).
struct StageSaved {
  StageSaved() = default;
  StageSaved(StageSaved&&) = default;
  StageSaved& operator=(StageSaved&&) = default;
  StageSaved(const StageSaved&) = delete;
  StageSaved& operator=(const StageSaved&) = delete;

  int64_t batch = 0, seq = 0;
  std::optional<EmbeddingSaved> embedding;     // first stage
  std::vector<TransformerLayerSaved> layers;   // one per layer of the stage, in order (empty while recomputed)
  std::vector<RecomputedLayers> recomputed;    // full recomputation's units
  std::optional<HeadSaved> head;               // last stage
};

struct StageOutput {
  Tensor hidden;  // non-last stages: the output hidden state
  Tensor loss;    // last stage with labels: the mean masked loss, device scalar
  Tensor logits;  // last stage without labels: [b * s, V / TP]
  StageSaved saved;
};

// The options of forward_backward on a whole model.
struct StepOptions {
  uint64_t dropout_step = 0;
  double grad_scale = 1.0;
  double loss_denominator = 0.0;
  ParamHooks hooks = {};
};

class GPTModel {
 public:
  // Allocates this stage's parameters on ctx's device and initialises them (init()). On CUDA the parameters
  // must be BF16 or F16 and the head dimension a multiple of 8 (the fused attention's limits); the
  // architecture must split over tp.size() ranks and the layout fit the model; all checked before
  // allocating, every violation listed.
  GPTModel(Context& ctx, const TransformerConfig& config, const parallel::TensorParallel& tp = {},
           const StageLayout& layout = {}, const parallel::ContextParallel& cp = {}, const MoeParallel& moe = {});
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // Megatron's init: weights normal(0, init_method_std), linear_proj / linear_fc2 normal(0, std / sqrt(2L)),
  // biases 0, norm weights 1; Philox (config.seed, offset = hash of the parameter name).
  void init(Context& ctx);

  [[nodiscard]] StageOutput forward(Context& ctx, const StageInput& input, const ForwardOptions& options) const;
  Tensor backward(Context& ctx, StageSaved&& saved, const Tensor& doutput = Tensor(), const ParamHooks& hooks = {});

  double forward_backward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                          const StepOptions& step = {});
  double forward_loss(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask) const;

  // Every trainable parameter of this stage once, in a stable order (embedding, layers, final norm, output
  // layer).
  ParameterList parameters();
  // The same parameters by module group, each once: the embedding's, each layer's, the final norm's with the
  // output layer (the groups the hooks name; FSDP's units).
  std::vector<ParameterList> parameter_groups();
  const TransformerConfig& config() const { return config_; }
  const StageLayout& layout() const { return layout_; }
  bool is_whole_model() const { return layout_.pre_process && layout_.post_process; }
  // The weight the logits are computed with (word embeddings when tied and on this stage).
  const Parameter& output_weight() const;
  Parameter& output_weight();
  const parallel::TensorParallel& tensor_parallel() const { return tp_; }
  // The FP8 scaling state of this stage's FP8 linears (config().fp8 enabled and at least one FP8 layer here),
  // else null. The trainer ends each iteration on it (Fp8ScalingState::end_iteration).
  const std::shared_ptr<Fp8ScalingState>& fp8_state() const { return fp8_; }
  const parallel::ContextParallel& context_parallel() const { return cp_; }

  LanguageModelEmbedding embedding;  // pre_process only
  std::vector<TransformerLayer> layers;
  Norm final_layernorm;              // post_process only
  Parameter output_layer;            // post_process, untied ("output_layer.weight") or a tied copy (see above)

 private:
  ResidualStream embed(Context& ctx, StageSaved& saved, const StageInput& input, const ForwardOptions& options,
                       uint64_t dropout_offset) const;
  // The final norm and the output layer: this rank's logits [b * s, V / TP]; saved.head gets their inputs.
  Tensor logits_forward(Context& ctx, StageSaved& saved, const ResidualStream& stream, const ParamHooks& hooks) const;
  // The stage's layers on `stream`, keeping what the backward needs in saved.layers (saved.recomputed for the
  // full recomputation's units); returns the last layer's output stream.
  ResidualStream layers_forward(Context& ctx, StageSaved& saved, ResidualStream stream, const StageInput& input,
                                const ForwardOptions& options, uint64_t offset) const;
  // Full recomputation: when the backward reaches layer `last` and it ends a unit, the unit's forwards run again
  // from its saved input, filling in its layers' saved state.
  void recompute_unit_ending_at(Context& ctx, StageSaved& s, size_t last, const ParamHooks& hooks) const;
  // What a full-recomputation unit keeps of its input x: x itself, or with --distribute-saved-activations (TP
  // without SP) a copy of this rank's 1/TP of it, its shape noted in u.
  Tensor unit_input(Context& ctx, const Tensor& x, RecomputedLayers& u) const;
  Tensor head_forward(Context& ctx, StageSaved& saved, const ResidualStream& stream, const StageInput& input,
                      const ForwardOptions& options) const;
  Tensor head_backward(Context& ctx, HeadSaved&& saved, const ParamHooks& hooks);
  // The Philox offset of this micro-batch's first dropout site (the embedding's; layer i's sites follow).
  uint64_t dropout_offset(uint64_t dropout_step) const;
  // The Philox offset of layer `layer`'s attention dropout in this micro-batch (a stream apart from the others).
  uint64_t attention_dropout_offset(uint64_t dropout_step, uint64_t layer) const;
  // Context parallelism: the device positions [seq] of this rank's local tokens (a workspace per seq);
  // undefined without CP.
  Tensor token_positions(Context& ctx, int64_t seq) const;
  // The first vocabulary entry of this rank's shard of the output layer.
  int64_t vocab_start() const { return int64_t(tp_.rank()) * (config_.padded_vocab_size / tp_.size()); }

  TransformerConfig config_;
  parallel::TensorParallel tp_;
  std::shared_ptr<Fp8ScalingState> fp8_;
  parallel::ContextParallel cp_;
  StageLayout layout_;
  mutable Tensor positions_;
  // The parameters of each module group the hooks name, gathered once.
  ParameterList embedding_group_, head_group_;
  ParameterList head_uses_;  // head_group_ and, tied on this stage, the word embeddings the logits use
  std::vector<ParameterList> layer_groups_;
};

}  // namespace megatron::nn
