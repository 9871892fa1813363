#include "megatron/nn/gpt_model.h"

#include <string>

#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/vocab_parallel_cross_entropy.h"
#include "megatron/parallel/mappings.h"
#include "megatron/ops/cross_entropy/cross_entropy.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {

namespace {

// Dropout offsets: a stream of its own, one block of sites per forward pass.
constexpr uint64_t kDropoutStream = uint64_t(1) << 62;

double read_scalar(Context& ctx, const Tensor& t) {
  if (t.dtype() == DType::F64) {
    double v = 0;
    copy_tensor(ctx, Tensor::from_blob(&v, {1}, DType::F64, Device::cpu()), t);
    return v;
  }
  float v = 0;
  copy_tensor(ctx, Tensor::from_blob(&v, {1}, DType::F32, Device::cpu()), t);
  return double(v);
}

// Checked before any allocation: the splits over TP, and what the CUDA ops of this model cannot do.
const ModelConfig& check_supported(Context& ctx, const ModelConfig& config, const parallel::TensorParallel& tp) {
  std::vector<std::string> v = model_config_violations(config, tp.size());
  if (!v.empty()) {
    std::string msg = str_cat("GPTModel: configuration cannot be split over ", tp.size(), " tensor-parallel ranks:");
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  if (!ctx.is_cuda()) return config;
  if (config.params_dtype != DType::BF16 && config.params_dtype != DType::F16)
    v.push_back(str_cat("parameter dtype ", dtype_name(config.params_dtype),
                        " on CUDA: the fused attention (cuDNN) runs in bf16/fp16 only; use --bf16 or --fp16"));
  if (config.head_dim() % 8 != 0 || config.head_dim() > 256)
    v.push_back(str_cat("--kv-channels ", config.head_dim(),
                        " on CUDA: the fused attention needs a head dimension that is a multiple of 8 and <= 256"));
  if (!v.empty()) {
    std::string msg = "GPTModel: configuration not supported on CUDA:";
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  return config;
}
}  // namespace

GPTModel::GPTModel(Context& ctx, const ModelConfig& config, const parallel::TensorParallel& tp)
    : embedding(ctx, check_supported(ctx, config, tp), tp),
      final_layernorm(ctx, "decoder.final_layernorm", config, tp),
      config_(config),
      tp_(tp) {
  layers.reserve(size_t(config.num_layers()));
  for (int i = 0; i < config.num_layers(); ++i)
    layers.emplace_back(ctx, "decoder.layers." + std::to_string(i), config, tp);
  if (!config.tied())
    output_layer = make_parameter(ctx, "output_layer.weight", {config.padded_vocab_size, config.hidden()},
                                  config.params_dtype, false, {.dim = 0, .blocks = 1, .rank = tp.rank(), .size = tp.size()});
  init(ctx);
}

void GPTModel::init(Context& ctx) {
  embedding.init(ctx);
  for (TransformerLayer& layer : layers) layer.init(ctx, config_);
  final_layernorm.init(ctx);
  if (output_layer.defined()) init_normal(ctx, output_layer, config_.seed, config_.args.init_method_std);
}

void GPTModel::finish_sequence_parallel_grads(Context& ctx) {
  if (!tp_.sp()) return;
  ParameterList norms;
  for (TransformerLayer& layer : layers) {
    layer.input_layernorm.collect_parameters(norms);
    layer.pre_mlp_layernorm.collect_parameters(norms);
  }
  final_layernorm.collect_parameters(norms);
  int64_t total = 0;
  for (const Parameter* p : norms) total += p->main_grad.numel();
  // One all-reduce over TP of all the norms' gradients, packed (they are views scattered over the DP buffer).
  Tensor packed = ctx.empty({total}, norms.front()->main_grad.dtype());
  int64_t at = 0;
  for (const Parameter* p : norms) {
    ops::copy(ctx, packed.slice(at, at + p->main_grad.numel()), p->main_grad.view({p->main_grad.numel()}));
    at += p->main_grad.numel();
  }
  parallel::reduce_from_tp_forward(ctx, tp_, packed);
  at = 0;
  for (Parameter* p : norms) {
    ops::copy(ctx, p->main_grad.view({p->main_grad.numel()}), packed.slice(at, at + p->main_grad.numel()));
    at += p->main_grad.numel();
  }
}

ParameterList GPTModel::parameters() {
  ParameterList list;
  embedding.collect_parameters(list);
  for (TransformerLayer& layer : layers) layer.collect_parameters(list);
  final_layernorm.collect_parameters(list);
  if (output_layer.defined()) list.push_back(&output_layer);
  return list;
}

namespace {
// Calls `hook` with the parameters `collect` gathers (data-parallel overlap, see ParamHooks).
template <class Collect>
void call_hook(const std::function<void(const ParameterList&)>& hook, Collect&& collect) {
  if (!hook) return;
  ParameterList params;
  collect(params);
  hook(params);
}
}  // namespace

Tensor GPTModel::forward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                         bool training, uint64_t dropout_step, const ParamHooks& hooks, const Tensor& dlosses) {
  MEGATRON_CHECK(tokens.rank() == 2 && labels.shape() == tokens.shape() && loss_mask.shape() == tokens.shape(),
                 "GPTModel: tokens, labels and loss_mask must all be [b, s]; got ", tokens.describe(), ", ",
                 labels.describe(), ", ", loss_mask.describe());
  const int64_t b = tokens.dim(0), s = tokens.dim(1), T = b * s, h = config_.hidden();
  const int64_t rows = tp_.sp_rows(T);  // this rank's token rows of the sequence-parallel region
  MEGATRON_CHECK(!tp_.sp() || T % tp_.size() == 0, "GPTModel: ", T, " tokens per micro-batch do not split over ",
                 tp_.size(), " sequence-parallel ranks");
  const DType dt = config_.params_dtype, st = config_.stats_dtype();
  const uint64_t sites = 1 + TransformerLayer::kDropoutSites * layers.size();
  const uint64_t offset = kDropoutStream + dropout_step * sites;

  Tensor embedded = ctx.empty({rows, h}, dt);
  call_hook(hooks.before_forward, [&](ParameterList& l) { embedding.collect_parameters(l); });
  embedding.forward(ctx, embedded, tokens, training, offset);
  ResidualStream stream{embedded, Tensor()};
  for (size_t i = 0; i < layers.size(); ++i) {
    call_hook(hooks.before_forward, [&](ParameterList& l) { layers[i].collect_parameters(l); });
    stream = layers[i].forward(ctx, stream, training, offset + 1 + TransformerLayer::kDropoutSites * i, s);
  }
  call_hook(hooks.before_forward, [&](ParameterList& l) {
    final_layernorm.collect_parameters(l);
    if (output_layer.defined()) l.push_back(&output_layer);
  });
  final_hidden_ = ctx.empty({rows, h}, dt);
  norm_of_stream(ctx, final_layernorm, final_hidden_, stream);

  // The output layer is column-parallel over the vocabulary (the tied embedding's shard): this rank's logits.
  Parameter& weight = output_weight();
  logits_ = ctx.empty({T, weight.value.dim(0)}, dt);
  column_parallel_linear_forward(ctx, tp_, logits_, final_hidden_, weight, nullptr);

  Tensor losses = ctx.empty({T}, st);
  lse_ = ctx.empty({T}, st);
  labels_ = labels.view({T});
  loss_mask_ = loss_mask.view({T});
  if (dlosses.defined()) {  // training: the loss gradient is known, so the gradient comes out of the same pass
    vocab_parallel_cross_entropy_forward_backward(ctx, tp_, losses, lse_, logits_, dlosses, logits_, labels_,
                                                  vocab_start(), config_.padded_vocab_size);  // logits_ := dlogits
  } else {
    vocab_parallel_cross_entropy(ctx, tp_, losses, lse_, logits_, labels_, vocab_start(), config_.padded_vocab_size);
  }
  Tensor loss = ctx.empty({1}, st);
  ops::masked_mean_loss(ctx, loss, losses, loss_mask_);
  hidden_shape_ = {b, s};
  return loss;
}

void GPTModel::backward(Context& ctx, const ParamHooks& hooks) {
  const int64_t T = hidden_shape_[0] * hidden_shape_[1], h = config_.hidden(), rows = tp_.sp_rows(T);
  const DType dt = config_.params_dtype;

  // logits_ already holds dlogits (this rank's vocabulary columns; the forward's fused cross-entropy).
  Tensor dfinal = ctx.empty({rows, h}, dt);
  column_parallel_linear_backward(ctx, tp_, dfinal, logits_, final_hidden_, output_weight(), nullptr);
  Tensor dhidden = ctx.empty({rows, h}, dt);
  final_layernorm.backward(ctx, dhidden, dfinal);
  call_hook(hooks.grads_final, [&](ParameterList& l) {
    final_layernorm.collect_parameters(l);
    if (output_layer.defined()) l.push_back(&output_layer);
  });

  for (size_t i = layers.size(); i-- > 0;) {
    Tensor dprev = ctx.empty({rows, h}, dt);
    layers[i].backward(ctx, dprev, dhidden);
    call_hook(hooks.grads_final, [&](ParameterList& l) { layers[i].collect_parameters(l); });
    dhidden = dprev;
  }
  embedding.backward(ctx, dhidden);
  call_hook(hooks.grads_final, [&](ParameterList& l) { embedding.collect_parameters(l); });
}

double GPTModel::forward_backward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                                  const StepOptions& step) {
  return read_scalar(ctx, forward_backward_async(ctx, tokens, labels, loss_mask, step));
}

Tensor GPTModel::forward_backward_async(Context& ctx, const Tensor& tokens, const Tensor& labels,
                                        const Tensor& loss_mask, const StepOptions& step) {
  // Without a denominator from the caller, reading this micro-batch's mask sum costs one synchronisation.
  const Tensor mask = loss_mask.view({loss_mask.numel()});
  double denominator = step.loss_denominator;
  if (denominator <= 0) {
    Tensor mask_sum = ctx.empty({1}, DType::F32);
    ops::sum_all(ctx, mask_sum, mask);
    denominator = read_scalar(ctx, mask_sum);
  }
  // An all-zero mask gives loss 0 and no gradient (Megatron's masked mean would divide by zero).
  if (denominator == 0.0) {
    Tensor loss = forward(ctx, tokens, labels, loss_mask, /*training=*/true, step.dropout_step, step.hooks);
    final_hidden_ = logits_ = lse_ = labels_ = loss_mask_ = Tensor();
    return loss;
  }
  // d(grad_scale * sum(loss * mask) / denominator) / d loss[t] = mask[t] * grad_scale / denominator, known
  // before the forward: the cross-entropy computes the loss and its gradient in one pass.
  Tensor dlosses = ctx.empty({mask.numel()}, config_.stats_dtype());
  ops::masked_mean_loss_grad(ctx, dlosses, mask, denominator / step.grad_scale);
  Tensor loss = forward(ctx, tokens, labels, loss_mask, /*training=*/true, step.dropout_step, step.hooks, dlosses);
  backward(ctx, step.hooks);
  final_hidden_ = logits_ = lse_ = labels_ = loss_mask_ = Tensor();
  return loss;
}

double GPTModel::forward_loss(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask) {
  Tensor loss = forward(ctx, tokens, labels, loss_mask, /*training=*/false, 0);
  final_hidden_ = logits_ = lse_ = labels_ = loss_mask_ = Tensor();
  return read_scalar(ctx, loss);
}

}  // namespace megatron::nn
