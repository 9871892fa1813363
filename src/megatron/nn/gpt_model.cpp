#include "megatron/nn/gpt_model.h"

#include <string>
#include <vector>

#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/vocab_parallel_cross_entropy.h"
#include "megatron/ops/cross_entropy/cross_entropy.h"
#include "megatron/ops/elementwise/elementwise.h"

namespace megatron::nn {

namespace {

// Dropout offsets: a stream of their own, one block of sites per forward pass (the embedding's, then
// kDropoutSites per layer, by global layer number, so every pipeline layout draws the same masks).
constexpr uint64_t kDropoutStream = uint64_t(1) << 62;
// Attention dropout: another stream, one offset per layer (by global layer number) and forward pass.
constexpr uint64_t kAttentionDropoutStream = uint64_t(3) << 61;

// The layout with num_layers resolved; every violated constraint listed.
StageLayout resolve_layout(const TransformerConfig& config, StageLayout layout) {
  const int L = config.num_layers;
  if (layout.num_layers < 0) layout.num_layers = L - layout.first_layer;
  std::vector<std::string> v;
  if (layout.first_layer < 0 || layout.num_layers < 0 || layout.first_layer + layout.num_layers > L)
    v.push_back(str_cat("layers [", layout.first_layer, ", ", layout.first_layer + layout.num_layers,
                        ") are not within the model's ", L, " layers"));
  if (layout.pre_process && layout.first_layer != 0)
    v.push_back(str_cat("the stage with the embedding must start at layer 0, not ", layout.first_layer));
  if (layout.post_process && layout.first_layer + layout.num_layers != L)
    v.push_back(str_cat("the stage with the output layer must end at the last layer (", L, "), not at ",
                        layout.first_layer + layout.num_layers));
  if (!v.empty()) {
    std::string msg = "GPTModel: invalid stage layout:";
    for (const std::string& s : v) msg += "\n  - " + s;
    MEGATRON_FAIL(msg);
  }
  return layout;
}

// Checked before any allocation: the splits over TP, and what the CUDA ops of this model cannot do.
const TransformerConfig& check_supported(Context& ctx, const TransformerConfig& config,
                                         const parallel::TensorParallel& tp) {
  std::vector<std::string> v = config.violations(tp.size());
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

// A pipeline's tied word embeddings: both the first stage's table and the last stage's copy are summed over
// the embedding group; only the first one counts in norms and checkpoints.
Placement word_embedding_placement(const TransformerConfig& config, const StageLayout& layout) {
  return Placement{.shared_embedding = config.tied() && !(layout.pre_process && layout.post_process)};
}

// Calls `hook` with `group` (data-parallel overlap, see ParamHooks).
void call_hook(const std::function<void(const ParameterList&)>& hook, const ParameterList& group) {
  if (hook && !group.empty()) hook(group);
}

}  // namespace

GPTModel::GPTModel(Context& ctx, const TransformerConfig& config, const parallel::TensorParallel& tp,
                   const StageLayout& layout, const parallel::ContextParallel& cp, const MoeParallel& moe)
    : config_(check_supported(ctx, config, tp)), tp_(tp), cp_(cp), layout_(resolve_layout(config, layout)) {
  if (layout_.pre_process)
    embedding = LanguageModelEmbedding(ctx, config, tp, word_embedding_placement(config, layout_), cp);
  layers.reserve(size_t(layout_.num_layers));
  for (int i = 0; i < layout_.num_layers; ++i) {
    const int global = layout_.first_layer + i;
    layers.emplace_back(ctx, "decoder.layers." + std::to_string(global), config, tp, cp, global, moe);
    if (config.fp8.fp8_layer(global, config.num_layers)) {
      if (!fp8_) fp8_ = std::make_shared<Fp8ScalingState>(config.fp8);
      layers.back().enable_fp8(fp8_);
    }
  }
  if (fp8_) fp8_->allocate(ctx);
  if (layout_.post_process) {
    final_layernorm = Norm(ctx, "decoder.final_layernorm", config, tp);
    const TensorParallelSplit rows{.dim = 0, .blocks = 1, .rank = tp.rank(), .size = tp.size()};
    if (!config.tied())
      output_layer = make_parameter(ctx, "output_layer.weight", {config.padded_vocab_size, config.hidden()},
                                    config.params_dtype, false, {.tp = rows});
    else if (!layout_.pre_process)  // the last stage's copy of the tied word embeddings
      output_layer = make_parameter(ctx, "embedding.word_embeddings.weight", {config.padded_vocab_size, config.hidden()},
                                    config.params_dtype, false,
                                    {.tp = rows, .shared_embedding = true, .shared_embedding_copy = true});
  }
  if (layout_.pre_process) embedding.collect_parameters(embedding_group_);
  for (TransformerLayer& layer : layers) layer.collect_parameters(layer_groups_.emplace_back());
  if (layout_.post_process) {
    final_layernorm.collect_parameters(head_group_);
    if (output_layer.defined()) head_group_.push_back(&output_layer);
    head_uses_ = head_group_;
    if (!output_layer.defined()) head_uses_.push_back(&output_weight());
  }
  init(ctx);
}

void GPTModel::init(Context& ctx) {
  if (layout_.pre_process) embedding.init(ctx);
  for (TransformerLayer& layer : layers) layer.init(ctx, config_);
  if (layout_.post_process) final_layernorm.init(ctx);
  // A tied copy draws the word embeddings' values: the same name, hence the same Philox stream.
  if (output_layer.defined()) init_normal(ctx, output_layer, config_.seed, config_.init_method_std);
}

std::vector<ParameterList> GPTModel::parameter_groups() {
  std::vector<ParameterList> groups;
  if (!embedding_group_.empty()) groups.push_back(embedding_group_);
  groups.insert(groups.end(), layer_groups_.begin(), layer_groups_.end());
  if (!head_group_.empty()) groups.push_back(head_group_);
  return groups;
}

ParameterList GPTModel::parameters() {
  ParameterList list = embedding_group_;
  for (const ParameterList& group : layer_groups_) list.insert(list.end(), group.begin(), group.end());
  list.insert(list.end(), head_group_.begin(), head_group_.end());
  return list;
}

const Parameter& GPTModel::output_weight() const {
  return config_.tied() && layout_.pre_process ? embedding.word_embeddings.weight : output_layer;
}

Parameter& GPTModel::output_weight() {
  return config_.tied() && layout_.pre_process ? embedding.word_embeddings.weight : output_layer;
}

Tensor GPTModel::token_positions(Context& ctx, int64_t seq) const {
  if (!cp_.enabled()) return Tensor();
  if (!positions_.defined() || positions_.dim(0) != seq) {
    std::vector<int64_t> positions = cp_.split(seq * cp_.size()).positions();
    positions_ = ctx.empty({seq}, DType::I64);
    ops::copy(ctx, positions_, Tensor::from_blob(positions.data(), {seq}, DType::I64, Device::cpu()));
    ctx.synchronize();  // `positions` dies here; happens once per length
  }
  return positions_;
}

uint64_t GPTModel::dropout_offset(uint64_t dropout_step) const {
  const uint64_t sites = 1 + TransformerLayer::kDropoutSites * uint64_t(config_.num_layers);
  return kDropoutStream + dropout_step * sites;
}

uint64_t GPTModel::attention_dropout_offset(uint64_t dropout_step, uint64_t layer) const {
  return kAttentionDropoutStream + dropout_step * uint64_t(config_.num_layers) + layer;
}

ResidualStream GPTModel::embed(Context& ctx, StageSaved& saved, const StageInput& input, const ForwardOptions& options,
                               uint64_t offset) const {
  const int64_t T = saved.batch * saved.seq;
  Tensor embedded = ctx.empty({tp_.sp_rows(T), config_.hidden()}, config_.params_dtype);
  call_hook(options.hooks.before_forward, embedding_group_);
  EmbeddingSaved e = embedding.forward(ctx, embedded, input.tokens, options.training, offset, options.position,
                                       input.position_ids);
  call_hook(options.hooks.after_forward, embedding_group_);
  if (options.training) saved.embedding = std::move(e);
  return ResidualStream{embedded, Tensor()};
}

StageOutput GPTModel::forward(Context& ctx, const StageInput& input, const ForwardOptions& options) const {
  StageOutput out;
  StageSaved& saved = out.saved;
  saved.batch = input.tokens.defined() ? input.tokens.dim(0) : input.batch;
  saved.seq = input.tokens.defined() ? input.tokens.dim(1) : input.seq;
  const int64_t T = saved.batch * saved.seq, rows = tp_.sp_rows(T);
  MEGATRON_CHECK(!layout_.pre_process || input.tokens.rank() == 2, "GPTModel: the first stage needs tokens [b, s]; got ",
                 input.tokens.describe());
  MEGATRON_CHECK(layout_.pre_process || input.hidden.numel() == rows * config_.hidden(), "GPTModel: stage input ",
                 input.hidden.describe(), " must hold ", rows, " token rows of ", config_.hidden(), " (b ", saved.batch,
                 ", s ", saved.seq, ")");
  MEGATRON_CHECK(!tp_.sp() || T % tp_.size() == 0, "GPTModel: ", T, " tokens per micro-batch do not split over ",
                 tp_.size(), " sequence-parallel ranks");
  const uint64_t offset = dropout_offset(options.dropout_step);
  MEGATRON_CHECK(options.kv_caches == nullptr || (options.kv_caches->size() == layers.size() && !options.training),
                 "GPTModel: generation needs one key/value cache per layer (", layers.size(), ") and no training");

  ResidualStream stream = layout_.pre_process ? embed(ctx, saved, input, options, offset)
                                              : ResidualStream{input.hidden.view({rows, config_.hidden()}), Tensor()};
  stream = layers_forward(ctx, saved, std::move(stream), input, options, offset);
  if (layout_.post_process && !input.labels.defined()) {
    out.logits = logits_forward(ctx, saved, stream, options.hooks);
    if (!options.training) saved.head.reset();
  } else if (layout_.post_process) {
    out.loss = head_forward(ctx, saved, stream, input, options);
  } else if (stream.branch.defined()) {  // a stage boundary carries the hidden state itself: residual + branch
    out.hidden = ctx.empty(stream.residual.shape(), stream.residual.dtype());
    ops::add(ctx, out.hidden, stream.residual, stream.branch);
  } else {
    out.hidden = stream.residual;
  }
  return out;
}

ResidualStream GPTModel::layers_forward(Context& ctx, StageSaved& saved, ResidualStream stream, const StageInput& input,
                                      const ForwardOptions& options, uint64_t offset) const {
  saved.layers.reserve(layers.size());
  const Tensor positions = input.position_ids.defined() ? input.position_ids : token_positions(ctx, saved.seq);
  // Full recomputation: the units whose layers keep only the unit's input and their passes.
  const std::vector<std::pair<int, int>> units =
      options.training ? config_.recompute.units(int(layers.size())) : std::vector<std::pair<int, int>>();
  size_t unit = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    call_hook(options.hooks.before_forward, layer_groups_[i]);
    const uint64_t global = uint64_t(layout_.first_layer) + i;
    const LayerPass pass{.training = options.training,
                         .dropout_offset = offset + 1 + TransformerLayer::kDropoutSites * global,
                         .attention_dropout_offset = attention_dropout_offset(options.dropout_step, global),
                         .seq = saved.seq,
                         .positions = positions,
                         .cu_seqlens = input.cu_seqlens,
                         .kv_cache = options.kv_caches ? &(*options.kv_caches)[i] : nullptr,
                         .position = options.position,
                         // The router losses enter the gradient as the main loss does, and CP ranks hold
                         // parts of one loss (the data-parallel average divides by CP).
                         .moe_loss_grad_scale = options.grad_scale * cp_.size(),
                         .timers = options.timers};
    const bool recomputed = unit < units.size() && int(i) >= units[unit].first;
    if (recomputed && int(i) == units[unit].first) saved.recomputed.push_back({.first = i});
    ResidualStream next;
    TransformerLayerSaved layer_saved = layers[i].forward(ctx, next, stream, pass);
    call_hook(options.hooks.after_forward, layer_groups_[i]);
    if (recomputed) {
      RecomputedLayers& u = saved.recomputed.back();
      if (u.passes.empty()) u.input = unit_input(ctx, layer_saved.input_norm.x, u);  // residual + branch
      u.passes.push_back(pass);
      saved.layers.emplace_back();  // layer_saved is dropped here: the backward computes it again
      if (int(i) + 1 == units[unit].first + units[unit].second) ++unit;
    } else if (options.training) {
      saved.layers.push_back(std::move(layer_saved));
    }
    stream = std::move(next);
  }
  return stream;
}

Tensor GPTModel::unit_input(Context& ctx, const Tensor& x, RecomputedLayers& u) const {
  if (!config_.recompute.distribute_saved_activations || !tp_.enabled() || tp_.sp()) return x;
  const int64_t n = x.numel(), part = n / tp_.size();
  MEGATRON_CHECK(n % tp_.size() == 0, "--distribute-saved-activations: a layer input of ", n,
                 " elements does not split into ", tp_.size(), " equal parts");
  u.input_shape = x.shape();
  Tensor mine = ctx.empty({part}, x.dtype());
  ops::copy(ctx, mine, x.view({n}).slice(int64_t(tp_.rank()) * part, int64_t(tp_.rank() + 1) * part));
  return mine;
}

void GPTModel::recompute_unit_ending_at(Context& ctx, StageSaved& s, size_t last, const ParamHooks& hooks) const {
  for (RecomputedLayers& u : s.recomputed) {
    if (u.first + u.passes.size() != last + 1 || !u.input.defined()) continue;
    Tensor input = std::move(u.input);
    u.input = Tensor();
    if (u.input_shape.rank() > 0) {  // distributed over TP: the whole input again
      Tensor whole = ctx.empty(u.input_shape, input.dtype());
      tp_.group->all_gather(whole.view({whole.numel()}), input, ctx.stream());
      input = whole;
    }
    ResidualStream stream{std::move(input), Tensor()};
    for (size_t j = 0; j < u.passes.size(); ++j) {
      ResidualStream next;
      call_hook(hooks.before_recompute ? hooks.before_recompute : hooks.before_forward, layer_groups_[u.first + j]);
      LayerPass pass = u.passes[j];
      pass.recomputing = true;
      s.layers[u.first + j] = layers[u.first + j].forward(ctx, next, stream, pass);
      call_hook(hooks.after_recompute ? hooks.after_recompute : hooks.after_forward, layer_groups_[u.first + j]);
      stream = std::move(next);
    }
  }
}

Tensor GPTModel::logits_forward(Context& ctx, StageSaved& saved, const ResidualStream& stream,
                                const ParamHooks& hooks) const {
  call_hook(hooks.before_forward, head_uses_);
  HeadSaved& head = saved.head.emplace();
  head.final_hidden = ctx.empty(stream.residual.shape(), config_.params_dtype);
  head.final_norm = norm_of_stream(ctx, final_layernorm, head.final_hidden, stream);
  // The output layer is column-parallel over the vocabulary (the tied embedding's shard): this rank's logits.
  const Parameter& weight = output_weight();
  Tensor logits = ctx.empty({saved.batch * saved.seq, weight.value.dim(0)}, config_.params_dtype);
  column_parallel_linear_forward(ctx, tp_, logits, head.final_hidden, weight, nullptr);
  call_hook(hooks.after_forward, head_uses_);
  return logits;
}

Tensor GPTModel::head_forward(Context& ctx, StageSaved& saved, const ResidualStream& stream, const StageInput& input,
                              const ForwardOptions& options) const {
  const int64_t T = saved.batch * saved.seq;
  MEGATRON_CHECK(input.labels.numel() == T && input.loss_mask.numel() == T, "GPTModel: labels ",
                 input.labels.describe(), " and loss_mask ", input.loss_mask.describe(), " must hold the ", T,
                 " tokens of the micro-batch");
  const DType st = config_.stats_dtype();
  const Tensor labels = input.labels.view({T}), mask = input.loss_mask.view({T});
  Tensor logits = logits_forward(ctx, saved, stream, options.hooks);
  HeadSaved& head = *saved.head;

  Tensor losses = ctx.empty({T}, st), lse = ctx.empty({T}, st);
  if (options.training) {
    // d(grad_scale * sum(loss * mask) / denominator) / d loss[t] = mask[t] * grad_scale / denominator is known
    // before the loss: the cross-entropy computes the loss and its gradient in one pass (logits := dlogits).
    double denominator = options.loss_denominator;
    if (denominator <= 0) {
      Tensor mask_sum = ctx.empty({1}, DType::F32);
      ops::sum_all(ctx, mask_sum, mask);
      denominator = read_scalar(ctx, mask_sum);
    }
    Tensor dlosses = ctx.empty({T}, st);
    if (denominator > 0)
      ops::masked_mean_loss_grad(ctx, dlosses, mask, denominator / options.grad_scale);
    else
      ops::fill(ctx, dlosses, 0.0);  // an all-zero mask: no gradient
    vocab_parallel_cross_entropy_forward_backward(ctx, tp_, losses, lse, logits, dlosses, logits, labels,
                                                  vocab_start(), config_.padded_vocab_size);
    head.dlogits = logits;
  } else {
    vocab_parallel_cross_entropy(ctx, tp_, losses, lse, logits, labels, vocab_start(), config_.padded_vocab_size);
    saved.head.reset();  // nothing is kept without a backward
  }
  Tensor loss = ctx.empty({1}, st);
  ops::masked_mean_loss(ctx, loss, losses, mask);
  return loss;
}

Tensor GPTModel::head_backward(Context& ctx, HeadSaved&& saved, const ParamHooks& hooks) {
  HeadSaved head = std::move(saved);
  MEGATRON_CHECK(head.dlogits.defined(), "GPTModel: backward of a forward without a loss gradient (an evaluation "
                 "forward, options.training = false)");
  const int64_t rows = head.final_hidden.shape().rows(), h = config_.hidden();
  const DType dt = config_.params_dtype;
  // dlogits: this rank's vocabulary columns (the forward's fused cross-entropy).
  call_hook(hooks.before_backward, head_uses_);
  Tensor dfinal = ctx.empty({rows, h}, dt);
  column_parallel_linear_backward(ctx, tp_, dfinal, head.dlogits, head.final_hidden, output_weight(), nullptr);
  head.dlogits = head.final_hidden = Tensor();
  Tensor dhidden = ctx.empty({rows, h}, dt);
  final_layernorm.backward(ctx, std::move(head.final_norm), dhidden, dfinal);
  call_hook(hooks.after_backward, head_uses_);
  call_hook(hooks.grads_final, head_group_);
  return dhidden;
}

Tensor GPTModel::backward(Context& ctx, StageSaved&& saved, const Tensor& doutput, const ParamHooks& hooks) {
  StageSaved s = std::move(saved);
  MEGATRON_CHECK(s.layers.size() == layers.size(), "GPTModel: backward of a saved state with ", s.layers.size(),
                 " layers on a stage of ", layers.size(), " (not this stage's forward, or already consumed)");
  const int64_t rows = tp_.sp_rows(s.batch * s.seq), h = config_.hidden();
  Tensor dhidden;
  if (layout_.post_process) {
    MEGATRON_CHECK(s.head.has_value(), "GPTModel: the last stage's backward needs its forward's saved loss state");
    dhidden = head_backward(ctx, std::move(*s.head), hooks);
    s.head.reset();
  } else {
    MEGATRON_CHECK(doutput.numel() == rows * h, "GPTModel: the output gradient ", doutput.describe(), " must hold ",
                   rows, " token rows of ", h);
    dhidden = doutput.view({rows, h});
  }
  for (size_t i = layers.size(); i-- > 0;) {
    recompute_unit_ending_at(ctx, s, i, hooks);
    Tensor dprev = ctx.empty({rows, h}, config_.params_dtype);
    call_hook(hooks.before_backward, layer_groups_[i]);
    layers[i].backward(ctx, std::move(s.layers[i]), dprev, dhidden);
    call_hook(hooks.after_backward, layer_groups_[i]);
    call_hook(hooks.grads_final, layer_groups_[i]);
    dhidden = dprev;
  }
  if (!layout_.pre_process) return dhidden;
  MEGATRON_CHECK(s.embedding.has_value(), "GPTModel: the first stage's backward needs its forward's saved ids");
  call_hook(hooks.before_backward, embedding_group_);
  embedding.backward(ctx, std::move(*s.embedding), dhidden);
  call_hook(hooks.after_backward, embedding_group_);
  call_hook(hooks.grads_final, embedding_group_);
  return Tensor();
}

double GPTModel::forward_backward(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                                  const StepOptions& step) {
  MEGATRON_CHECK(is_whole_model(), "GPTModel::forward_backward runs the whole model; this is a pipeline stage");
  StageOutput out = forward(ctx, {.tokens = tokens, .labels = labels, .loss_mask = loss_mask},
                            {.training = true,
                             .dropout_step = step.dropout_step,
                             .grad_scale = step.grad_scale,
                             .loss_denominator = step.loss_denominator,
                             .hooks = step.hooks});
  backward(ctx, std::move(out.saved), Tensor(), step.hooks);
  return read_scalar(ctx, out.loss);
}

double GPTModel::forward_loss(Context& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask) const {
  MEGATRON_CHECK(is_whole_model(), "GPTModel::forward_loss runs the whole model; this is a pipeline stage");
  return read_scalar(ctx, forward(ctx, {.tokens = tokens, .labels = labels, .loss_mask = loss_mask},
                                {.training = false}).loss);
}

}  // namespace megatron::nn
