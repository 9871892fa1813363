// GPTModel: Megatron's GPT (embedding -> L pre-norm transformer layers -> final norm -> output layer ->
// cross-entropy with a loss mask), with an explicit forward and backward.
//
// forward_backward(ctx, tokens, labels, loss_mask, step): tokens, labels [b, s] I32/I64, loss_mask [b, s] F32.
//   Returns the mean masked loss sum(loss * mask) / sum(mask) (Megatron's per-micro-batch loss), and
//   accumulates (+=) into every parameter's main_grad the gradient of
//   step.grad_scale * sum(loss * mask) / denominator, denominator = step.loss_denominator or sum(mask)
//   (the trainer passes grad_scale = 1 / num_micro_batches). An all-zero mask contributes no gradient. Zeroing main grads is the caller's (zero_grads, once per iteration).
//   Hidden/embedding dropout is on (training mode) with Philox offsets derived from step.dropout_step, which
//   must differ for every micro-batch of every iteration (e.g. iteration * num_micro_batches + micro_batch).
// forward_loss(...): the same loss, eval mode (no dropout), no gradients.
// Both return after synchronising with ctx's stream (the loss is read on the host, after the backward);
// forward_backward_async returns the loss as a device scalar instead, without synchronising.
// Saved activations are released at the end of each call.
//
// Tied embeddings (the default): the output layer multiplies by embedding.word_embeddings' value and adds
// its gradient into that parameter's main_grad; parameters() lists it once. Untied: "output_layer.weight"
// [padded V, h], normal(0, init_method_std), no bias. Logits cover the padded vocabulary (as in Megatron).
// Activations are in the parameter dtype; norm statistics, softmax/LSE and the loss are F32 (F64 for F64).
//
// Tensor parallelism (a TensorParallel of size TP > 1, parallel/tensor_parallel.h): the word embeddings (and
// the output layer, tied or not) are split by vocabulary rows, attention by query groups, the MLP by ffn
// columns (docs/parallelism.md); the loss is the vocabulary-parallel cross-entropy (no logits gathered), so
// every TP rank returns the same loss, and each rank's gradients are its pieces of the TP = 1 gradients (up to
// reduction order). With sequence parallelism the norms, dropout and residual stream hold this rank's token
// rows. Every parameter records its split (Parameter::tp; parameter_shard.h gives the global offsets), and
// its initial values are its piece of the TP = 1 initialisation, so TP = N is the TP = 1 function.
// Replicated parameters get the same gradient on every TP rank.
#pragma once

#include <functional>
#include <vector>

#include "megatron/nn/config.h"
#include "megatron/nn/embedding.h"
#include "megatron/nn/linear.h"
#include "megatron/nn/norm.h"
#include "megatron/nn/transformer_layer.h"

namespace megatron::nn {

// Data-parallel overlap hooks (parallel/data_parallel.h, optim/distributed_optimizer.h); empty = none.
// Each call names the parameters of one module: the embedding, one transformer layer, or the final norm
// with the output layer.
//   before_forward(params): forward is about to read their values (the distributed optimizer waits for
//                           their all-gather here);
//   grads_final(params):    backward has finished accumulating into their main_grads for this pass (the
//                           tied word embeddings only after the embedding's backward).
struct ParamHooks {
  std::function<void(const ParameterList&)> before_forward;
  std::function<void(const ParameterList&)> grads_final;
};

struct StepOptions {
  uint64_t dropout_step = 0;      // selects this pass's dropout masks
  double grad_scale = 1.0;        // gradients are of grad_scale * sum(loss * mask) / loss_denominator
  double loss_denominator = 0.0;  // 0: sum(loss_mask) of this micro-batch, read from the device (one sync);
                                  // the trainer passes it (it has the mask on the host) to avoid that sync
  ParamHooks hooks = {};
};

class GPTModel {
 public:
  // Allocates every parameter on ctx's device and initialises it (init()). On CUDA the parameters must be
  // BF16 or F16 and the head dimension a multiple of 8 (the fused attention's limits); the architecture must
  // split over tp.size() ranks; both checked before allocating, every violation listed.
  GPTModel(Context& ctx, const ModelConfig& config, const parallel::TensorParallel& tp = {});
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // Megatron's init: weights normal(0, init_method_std), linear_proj / linear_fc2 normal(0, std / sqrt(2L)),
  // biases 0, norm weights 1; Philox (config.seed, offset = hash of the parameter name).
  void init(Context& ctx);

  // The same, returning the loss as a device scalar (stats dtype, [1]) without waiting for the GPU (with
  // step.loss_denominator given); the trainer adds the micro-batches' losses on the device.
  Tensor forward_backward_async(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                                const StepOptions& step = {});
  double forward_backward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                          const StepOptions& step = {});
  double forward_loss(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask);

  // Under sequence parallelism: sums the norms' partial weight/bias gradients over TP (one all-reduce of all
  // of them). Once per iteration, after the last backward (and after the data-parallel reduction, if any: both
  // are sums); a no-op otherwise. The gradients are incomplete until then.
  void finish_sequence_parallel_grads(Context& ctx);

  // Every trainable parameter once, in a stable order (embedding, layers, final norm, output layer).
  ParameterList parameters();
  const ModelConfig& config() const { return config_; }
  // The weight the logits are computed with (word embeddings when tied).
  Parameter& output_weight() { return config_.tied() ? embedding.word_embeddings.weight : output_layer; }
  const parallel::TensorParallel& tensor_parallel() const { return tp_; }

  LanguageModelEmbedding embedding;
  std::vector<TransformerLayer> layers;
  Norm final_layernorm;
  Parameter output_layer;  // untied only: "output_layer.weight" (split by vocabulary rows over TP)

 private:
  // Runs the forward pass; returns the loss as a device scalar.
  // With `dlosses` (the loss gradient per token, training), the cross-entropy also leaves dlogits in logits_.
  Tensor forward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask, bool training,
                 uint64_t dropout_step, const ParamHooks& hooks = {}, const Tensor& dlosses = Tensor());
  // From dlogits (left in logits_ by the forward) down to the embedding.
  void backward(Context& ctx, const ParamHooks& hooks = {});
  // The first vocabulary entry of this rank's shard of the output layer.
  int64_t vocab_start() const { return int64_t(tp_.rank()) * (config_.padded_vocab_size / tp_.size()); }

  ModelConfig config_;
  parallel::TensorParallel tp_;
  // Saved by forward for backward.
  Tensor final_hidden_, logits_, lse_, labels_, loss_mask_;
  std::vector<int64_t> hidden_shape_;  // {b, s}
};

}  // namespace megatron::nn
