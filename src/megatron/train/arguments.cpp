#include "megatron/train/arguments.h"

#include <algorithm>
#include <set>

#include "megatron/core/error.h"
#include "megatron/parallel/pipeline_split.h"
#include "megatron/train/fp8_arguments.h"
#include "megatron/train/logging_arguments.h"
#include "megatron/train/recompute_arguments.h"
#include "megatron/train/schedule_arguments.h"
#include "megatron/train/moe_arguments.h"

namespace megatron::train {

int Arguments::data_parallel_size() const {
  int model_parallel = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size *
                       parallel.context_parallel_size;
  return model_parallel > 0 ? parallel.world_size / model_parallel : 0;
}

int Arguments::num_micro_batches() const {
  const int dp = data_parallel_size();
  return dp > 0 && training.micro_batch_size > 0 ? int(training.global_batch_size / (training.micro_batch_size * dp)) : 0;
}

int Arguments::padded_vocab_size() const {
  int multiple = model.make_vocab_size_divisible_by * parallel.tensor_model_parallel_size;
  if (multiple <= 0) return model.vocab_size;
  return (model.vocab_size + multiple - 1) / multiple * multiple;
}

bool Arguments::fsdp_shards_grads() const {
  return parallel.use_megatron_fsdp && (parallel.data_parallel_sharding_strategy == "optim_grads" ||
                                        parallel.data_parallel_sharding_strategy == "optim_grads_params");
}

bool Arguments::fsdp_shards_params() const {
  return parallel.use_megatron_fsdp && parallel.data_parallel_sharding_strategy == "optim_grads_params";
}

namespace {

// The model chunks per pipeline rank from whichever virtual-pipeline flag is given, and the micro-batch group.
void resolve_pipeline(Arguments& a) {
  ParallelArguments& p = a.parallel;
  p.virtual_pipeline_size = 1;
  if (p.virtual_pipeline_model_parallel_size > 0) p.virtual_pipeline_size = p.virtual_pipeline_model_parallel_size;
  if (p.num_virtual_stages_per_pipeline_rank > 0) p.virtual_pipeline_size = p.num_virtual_stages_per_pipeline_rank;
  if (!p.pipeline_model_parallel_layout.empty() && p.pipeline_model_parallel_size > 0) {
    try {  // a malformed text is reported by the validation
      const size_t stages = parallel::parse_pipeline_layout(p.pipeline_model_parallel_layout).size();
      if (stages % size_t(p.pipeline_model_parallel_size) == 0)
        p.virtual_pipeline_size = int(stages) / p.pipeline_model_parallel_size;
    } catch (const Error&) {
    }
  }
  if (p.num_layers_per_virtual_pipeline_stage > 0 && p.pipeline_model_parallel_size > 0) {
    const int counted = a.model.num_layers + p.account_for_embedding_in_pipeline_split +
                        p.account_for_loss_in_pipeline_split;
    const int per_stage = counted / p.pipeline_model_parallel_size;
    if (per_stage % p.num_layers_per_virtual_pipeline_stage == 0)
      p.virtual_pipeline_size = std::max(1, per_stage / p.num_layers_per_virtual_pipeline_stage);
  }
  if (p.microbatch_group_size_per_virtual_pipeline_stage == 0)
    p.microbatch_group_size_per_virtual_pipeline_stage = p.pipeline_model_parallel_size;
}

}  // namespace

void resolve(Arguments& a) {
  ModelArguments& m = a.model;
  if (m.ffn_hidden_size == 0) {
    // Megatron: SwiGLU has two input projections, so 2/3 of 4h keeps the parameter count; rounded down
    // to a multiple of 64.
    m.ffn_hidden_size = m.swiglu ? int((4.0 * m.hidden_size * 2 / 3) / 64) * 64 : 4 * m.hidden_size;
  }
  // Derived only when the heads divide the hidden size; otherwise --kv-channels must be given.
  if (m.kv_channels == 0 && m.num_attention_heads > 0 && m.hidden_size % m.num_attention_heads == 0)
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  // --num-query-groups N selects grouped-query attention; --group-query-attention alone means Megatron's
  // default of one group (MQA).
  if (m.num_query_groups == 0) m.num_query_groups = m.group_query_attention ? 1 : m.num_attention_heads;
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  TrainingArguments& t = a.training;
  if (t.global_batch_size == 0) {
    t.global_batch_size = t.micro_batch_size * std::max(1, a.data_parallel_size());
    t.global_batch_size_defaulted = true;
  }
  resolve_schedule(a);  // --train-samples -> train_iters, the batch-size schedule, the weight-decay range
  if (t.lr_decay_iters == 0 && t.train_samples == 0) t.lr_decay_iters = t.train_iters;
  // Megatron: under fp16's dynamic loss scaling a NaN or Inf gradient is an overflow that skips the step, not an
  // error, so the NaN check is off there.
  if (t.fp16 && t.loss_scale == 0) t.no_check_for_nan_in_loss_and_grad = true;
  // Megatron: "Disabling sequence parallelism because tensor model parallel size is 1".
  if (a.parallel.tensor_model_parallel_size == 1) {  // Megatron turns both off at TP 1: nothing to split
    a.parallel.sequence_parallel = false;
    a.parallel.tp_comm_overlap = false;
  }
  resolve_pipeline(a);
  // Megatron FSDP shards the optimizer state under every strategy but no_shard.
  if (a.parallel.use_megatron_fsdp && a.parallel.data_parallel_sharding_strategy != "no_shard")
    a.parallel.use_distributed_optimizer = true;
  MoeArguments& e = a.moe;
  if (e.num_experts > 0 && e.moe_ffn_hidden_size == 0) e.moe_ffn_hidden_size = m.ffn_hidden_size;
  if (a.parallel.expert_tensor_parallel_size == 0)
    a.parallel.expert_tensor_parallel_size = a.parallel.tensor_model_parallel_size;
}

namespace {

// Appends every violated constraint to `out`, one sentence each naming the flags and their values.
class Violations {
 public:
  explicit Violations(std::vector<std::string>& out) : out_(out) {}
  template <class... Parts>
  void need(bool ok, Parts&&... parts) {
    if (!ok) out_.push_back(str_cat(std::forward<Parts>(parts)...));
  }

 private:
  std::vector<std::string>& out_;
};

void model_violations(const ModelArguments& m, Violations& v) {
  v.need(m.num_layers > 0, "--num-layers must be set to a positive value (got ", m.num_layers, ")");
  v.need(m.hidden_size > 0, "--hidden-size must be set to a positive value (got ", m.hidden_size, ")");
  v.need(m.num_attention_heads > 0, "--num-attention-heads must be set to a positive value (got ",
         m.num_attention_heads, ")");
  v.need(m.seq_length > 0, "--seq-length must be set to a positive value (got ", m.seq_length, ")");
  if (m.num_attention_heads > 0 && m.hidden_size > 0) {
    v.need(m.kv_channels > 0, "--hidden-size ", m.hidden_size, " must be divisible by --num-attention-heads ",
           m.num_attention_heads, " (or give --kv-channels)");
    v.need(m.num_query_groups > 0 && m.num_attention_heads % m.num_query_groups == 0, "--num-attention-heads ",
           m.num_attention_heads, " must be divisible by --num-query-groups ", m.num_query_groups);
  }
  v.need(m.ffn_hidden_size > 0, "--ffn-hidden-size must be positive (got ", m.ffn_hidden_size, ")");
  static const std::set<std::string> positions = {"learned_absolute", "rope", "none"};
  v.need(positions.count(m.position_embedding_type), "--position-embedding-type '", m.position_embedding_type,
         "' must be one of learned_absolute, rope, none");
  if (m.position_embedding_type == "learned_absolute")
    v.need(m.max_position_embeddings >= m.seq_length, "--max-position-embeddings ", m.max_position_embeddings,
           " must be >= --seq-length ", m.seq_length, " with learned absolute positions");
  v.need(m.rotary_percent > 0 && m.rotary_percent <= 1, "--rotary-percent ", m.rotary_percent, " must be in (0, 1]");
  if (m.position_embedding_type == "rope" && m.kv_channels > 0)
    v.need(int(m.kv_channels * m.rotary_percent) % 2 == 0, "--rotary-percent ", m.rotary_percent, " of kv channels ",
           m.kv_channels, " must give an even number of rotated channels");
  v.need(m.normalization == "LayerNorm" || m.normalization == "RMSNorm", "--normalization '", m.normalization,
         "' must be LayerNorm or RMSNorm");
  v.need(m.norm_epsilon > 0, "--norm-epsilon must be positive (got ", m.norm_epsilon, ")");
  v.need(!m.no_position_embedding || m.position_embedding_type == "rope", "--no-position-embedding is deprecated "
         "(Megatron's error outside rope): use --position-embedding-type none (or rope)");
  v.need(m.attention_dropout >= 0 && m.attention_dropout < 1, "--attention-dropout ", m.attention_dropout,
         " must be in [0, 1)");
  v.need(m.hidden_dropout >= 0 && m.hidden_dropout < 1, "--hidden-dropout ", m.hidden_dropout, " must be in [0, 1)");
  v.need(m.init_method_std > 0, "--init-method-std must be positive (got ", m.init_method_std, ")");
  v.need(m.make_vocab_size_divisible_by > 0, "--make-vocab-size-divisible-by must be positive (got ",
         m.make_vocab_size_divisible_by, ")");
}

void training_violations(const TrainingArguments& t, Violations& v) {
  v.need(t.train_iters > 0 || t.train_samples > 0, "--train-iters or --train-samples must be set to a positive value");
  v.need(t.lr > 0, "--lr must be set to a positive value (got ", t.lr, ")");
  v.need(t.micro_batch_size > 0, "--micro-batch-size must be positive (got ", t.micro_batch_size, ")");
  static const std::set<std::string> decay = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  v.need(decay.count(t.lr_decay_style), "--lr-decay-style '", t.lr_decay_style,
         "' must be one of constant, linear, cosine, inverse-square-root, WSD");
  v.need(t.min_lr <= t.lr, "--min-lr ", t.min_lr, " must not exceed --lr ", t.lr);
  if (t.decoupled_lr != -1) {
    const double floor = t.decoupled_min_lr != -1 ? t.decoupled_min_lr : t.min_lr;
    v.need(t.decoupled_lr >= 0, "--decoupled-lr ", t.decoupled_lr, " must be >= 0");
    v.need(t.decoupled_min_lr == -1 || t.decoupled_min_lr >= 0, "--decoupled-min-lr ", t.decoupled_min_lr,
           " must be >= 0");
    v.need(floor <= t.decoupled_lr, t.decoupled_min_lr != -1 ? "--decoupled-min-lr " : "--min-lr (the floor without "
           "--decoupled-min-lr) ", floor, " must not exceed --decoupled-lr ", t.decoupled_lr);
  }
  v.need(!(t.bf16 && t.fp16), "--bf16 and --fp16 are mutually exclusive");
  v.need(t.device == "auto" || t.device == "cpu" || t.device == "cuda", "--device '", t.device,
         "' must be auto, cpu or cuda");
  v.need(t.cpu_threads >= 0, "--cpu-threads must be 0 (automatic) or positive (got ", t.cpu_threads, ")");
  v.need(t.log_interval > 0, "--log-interval must be positive (got ", t.log_interval, ")");
  v.need(t.optimizer_offload_fraction >= 0.0 && t.optimizer_offload_fraction <= 1.0,
         "--optimizer-offload-fraction ", t.optimizer_offload_fraction, " must be within [0, 1]");
  v.need(!t.overlap_cpu_optimizer_d2h_h2d || t.optimizer_cpu_offload,
         "--overlap-cpu-optimizer-d2h-h2d needs --optimizer-cpu-offload");
  v.need(t.eval_iters == 0 || t.eval_interval > 0, "--eval-interval must be positive when --eval-iters ",
         t.eval_iters, " > 0");
  if (t.profile)
    v.need(t.profile_step_start >= 1 && t.profile_step_end > t.profile_step_start, "--profile-step-start ",
           t.profile_step_start, " must be >= 1 and less than --profile-step-end ", t.profile_step_end);
}

// The layout: sizes, what each must divide, the batch over DP.
void parallel_violations(const Arguments& a, Violations& v) {
  const ModelArguments& m = a.model;
  const TrainingArguments& t = a.training;
  const ParallelArguments& p = a.parallel;
  const int tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size, cp = p.context_parallel_size;
  v.need(tp > 0 && pp > 0 && cp > 0 && p.expert_model_parallel_size > 0, "parallel sizes must be positive (TP ", tp,
         ", PP ", pp, ", CP ", cp, ", EP ", p.expert_model_parallel_size, ")");
  if (tp > 0 && pp > 0 && cp > 0) {
    v.need(p.world_size % (tp * pp * cp) == 0, "world size ", p.world_size,
           " must be divisible by --tensor-model-parallel-size ", tp, " x --pipeline-model-parallel-size ", pp,
           " x --context-parallel-size ", cp, " = ", tp * pp * cp);
    v.need(m.num_attention_heads % tp == 0, "--num-attention-heads ", m.num_attention_heads,
           " must be divisible by --tensor-model-parallel-size ", tp);
    v.need(m.num_query_groups % tp == 0, "--num-query-groups ", m.num_query_groups,
           " must be divisible by --tensor-model-parallel-size ", tp);
    v.need(m.hidden_size % tp == 0, "--hidden-size ", m.hidden_size, " must be divisible by --tensor-model-parallel-size ",
           tp);
    v.need(m.ffn_hidden_size % tp == 0, "--ffn-hidden-size ", m.ffn_hidden_size,
           " must be divisible by --tensor-model-parallel-size ", tp);
    if (p.sequence_parallel)
      v.need(m.seq_length % tp == 0, "--seq-length ", m.seq_length, " must be divisible by --tensor-model-parallel-size ",
             tp, " with --sequence-parallel");
    v.need(!p.tp_comm_overlap || p.sequence_parallel, "--tp-comm-overlap needs --sequence-parallel (it pipelines the "
           "sequence-parallel all-gathers and reduce-scatters with the GEMMs)");
    if (cp > 1)
      v.need(m.seq_length % (2 * cp) == 0, "--seq-length ", m.seq_length,
             " must be divisible by 2 x --context-parallel-size ", cp, " = ", 2 * cp);
    const int dp = a.data_parallel_size();
    if (dp > 0 && t.micro_batch_size > 0)
      v.need(t.global_batch_size % (t.micro_batch_size * dp) == 0, "--global-batch-size ", t.global_batch_size,
             " must be divisible by --micro-batch-size ", t.micro_batch_size, " x data-parallel size ", dp, " = ",
             t.micro_batch_size * dp);
  }
  if (p.overlap_param_gather)
    v.need(p.use_distributed_optimizer, "--overlap-param-gather needs --use-distributed-optimizer");
  // FSDP's sharded parameters exist whole only around their module's forward and backward; the expert bias is
  // changed after the step, outside those windows.
  v.need(!a.fsdp_shards_params() || !a.moe.moe_router_enable_expert_bias, "--data-parallel-sharding-strategy ",
         "optim_grads_params keeps only shards of the parameters between their uses; --moe-router-enable-expert-bias ",
         "updates the router bias outside them (not supported together: use optim_grads)");
  v.need(p.distributed_timeout_minutes > 0, "--distributed-timeout-minutes must be positive (got ",
         p.distributed_timeout_minutes, ")");
  v.need(p.ddp_bucket_size >= 0, "--ddp-bucket-size must be >= 0 (got ", p.ddp_bucket_size, ")");
}

// Pipeline parallelism: one virtual-pipeline flag at most, the layer split (every layer on exactly one stage),
// and the interleaved schedule's micro-batch rules (Megatron's, checked before any work).
void pipeline_violations(const Arguments& a, Violations& v) {
  const ParallelArguments& p = a.parallel;
  const int pp = p.pipeline_model_parallel_size, V = p.virtual_pipeline_size;
  const int given = (p.num_layers_per_virtual_pipeline_stage > 0) + (p.virtual_pipeline_model_parallel_size > 0) +
                    (p.num_virtual_stages_per_pipeline_rank > 0) + !p.pipeline_model_parallel_layout.empty();
  v.need(given <= 1, "give at most one of --num-layers-per-virtual-pipeline-stage, --virtual-pipeline-model-parallel-",
         "size, --num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout (the layout sets the ",
         "interleaving itself)");
  const bool uneven = p.decoder_first_pipeline_num_layers >= 0 || p.decoder_last_pipeline_num_layers >= 0;
  v.need(!(uneven && p.num_layers_per_virtual_pipeline_stage > 0), "with --decoder-first/last-pipeline-num-layers "
         "give the interleaving as --virtual-pipeline-model-parallel-size (or --num-virtual-stages-per-pipeline-rank), "
         "not --num-layers-per-virtual-pipeline-stage (Megatron's rule)");
  if (p.num_layers_per_virtual_pipeline_stage > 0 && pp > 0) {
    const int counted = a.model.num_layers + p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split;
    v.need(counted % pp == 0 && (counted / pp) % p.num_layers_per_virtual_pipeline_stage == 0, "the ", counted / std::max(pp, 1),
           " layers per pipeline stage must be divisible by --num-layers-per-virtual-pipeline-stage ",
           p.num_layers_per_virtual_pipeline_stage);
  }
  if (pp <= 0 || a.model.num_layers <= 0 || given > 1) return;
  v.need(V == 1 || pp > 1, "the interleaved schedule (", V, " model chunks per rank) needs --pipeline-model-parallel-size > 1");
  for (const std::string& s : parallel::pipeline_split_violations(pipeline_split_config(a))) v.need(false, s);
  if (V > 1) {
    const int M = a.num_micro_batches(), G = p.microbatch_group_size_per_virtual_pipeline_stage;
    v.need(G >= pp && G <= M, "--microbatch-group-size-per-virtual-pipeline-stage ", G, " must be in [pipeline size ", pp,
           ", micro-batches per iteration ", M, "] for the interleaved schedule");
    v.need(G <= 0 || M % G == 0 || M % G >= pp, "the ", M, " micro-batches per iteration leave a last group of ",
           G > 0 ? M % G : 0, " (--microbatch-group-size-per-virtual-pipeline-stage ", G, "): it must be 0 or at least the ",
           "pipeline size ", pp, " (otherwise the interleaved schedule stalls); with the default group size, use a ",
           "multiple of ", pp, " micro-batches");
  }
}

// Context parallelism: the communication types (one, or one per layer), the hierarchical sizes a2a+p2p
// needs (Megatron silently ran a2a+p2p without them as no CP at all), and the heads the all-to-all splits.
void context_parallel_violations(const Arguments& a, Violations& v) {
  const ParallelArguments& p = a.parallel;
  const ModelArguments& m = a.model;
  const int cp = p.context_parallel_size, tp = p.tensor_model_parallel_size;
  const size_t types = p.cp_comm_type.size();
  v.need(types <= 1 || types == size_t(m.num_layers), "--cp-comm-type gives ", types, " types: give one for every ",
         "layer or one per layer (", m.num_layers, ")");
  auto uses = [&](const char* type) {
    return std::any_of(p.cp_comm_type.begin(), p.cp_comm_type.end(), [&](const std::string& t) { return t == type; });
  };
  const std::vector<int>& h = p.hierarchical_context_parallel_sizes;
  int product = 1;
  for (int x : h) product *= x;
  if (!h.empty())
    v.need(std::all_of(h.begin(), h.end(), [](int x) { return x > 0; }) && product == cp,
           "--hierarchical-context-parallel-sizes must be positive and multiply to --context-parallel-size ", cp,
           " (got a product of ", product, ")");
  if (p.cp_comm_transport == "copy-engine")
    v.need(cp > 1 && (p.cp_comm_type.empty() || uses("p2p")), "--cp-comm-transport copy-engine moves the blocks of ",
           "the p2p ring: it needs --context-parallel-size > 1 (got ", cp, ") and --cp-comm-type p2p for at least one ",
           "layer (the default)");
  if (uses("a2a+p2p"))
    v.need(h.size() == 2, "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (the all-to-all ",
           "group size, then the ring size, A x P = CP ", cp, "), got ", h.size(), " sizes");
  if (p.hybrid_context_parallel) {
    // Megatron requires the per-token loss and refuses pipelining; the plan needs the documents of packed
    // micro-batches and power-of-two CP blocks, and the layouts it runs here are plain TP x CP x DP models.
    v.need(cp > 1 && (cp & (cp - 1)) == 0, "--hybrid-context-parallel needs a power-of-two --context-parallel-size ",
           "above 1, got ", cp);
    v.need(p.max_seqlen_per_dp_cp_rank > 0, "--hybrid-context-parallel needs --max-seqlen-per-dp-cp-rank N > 0 (the ",
           "document tokens one CP rank takes), got ", p.max_seqlen_per_dp_cp_rank);
    v.need(a.training.calculate_per_token_loss, "--hybrid-context-parallel needs --calculate-per-token-loss (as ",
           "Megatron: micro-batches on different numbers of ranks must weigh every token the same)");
    v.need(a.data.reset_attention_mask || a.data.sft, "--hybrid-context-parallel plans by document lengths: it needs ",
           "packed documents (--reset-attention-mask or --sft)");
    v.need(p.pipeline_model_parallel_size <= 1, "--hybrid-context-parallel with --pipeline-model-parallel-size > 1 ",
           "is refused (as Megatron refuses it)");
    v.need(a.moe.num_experts <= 0, "--hybrid-context-parallel with --num-experts: the routers' statistics groups are ",
           "the fixed CP group's; not supported");
    v.need(a.fp8.fp8_format.empty(), "--hybrid-context-parallel with FP8: the scaling factors are reduced over the ",
           "fixed CP group; not supported");
    v.need(!p.use_megatron_fsdp, "--hybrid-context-parallel with --use-megatron-fsdp is not supported");
    v.need(p.hierarchical_context_parallel_sizes.empty(), "--hybrid-context-parallel with ",
           "--hierarchical-context-parallel-sizes is not supported");
  } else {
    v.need(p.max_seqlen_per_dp_cp_rank == 0, "--max-seqlen-per-dp-cp-rank needs --hybrid-context-parallel");
  }
  if (cp <= 1 || tp <= 0) return;
  const int heads = m.num_attention_heads / tp, groups = m.num_query_groups / tp;
  auto heads_split = [&](const char* type, int ranks) {
    v.need(ranks > 0 && heads % ranks == 0 && groups % ranks == 0, "--cp-comm-type ", type, " splits the ", heads,
           " attention heads and ", groups, " query groups of each tensor-parallel rank over ", ranks,
           " ranks: both must be divisible by ", ranks);
  };
  if (uses("a2a")) heads_split("a2a", cp);
  if (uses("a2a+p2p") && h.size() == 2) heads_split("a2a+p2p", h[0]);
  if (p.sequence_parallel && tp > 1)
    v.need(m.seq_length % (cp * tp) == 0, "--seq-length ", m.seq_length, " must be divisible by --context-parallel-size ",
           cp, " x --tensor-model-parallel-size ", tp, " with --sequence-parallel (each rank's ", m.seq_length / cp,
           " tokens are split over TP)");
}

// The document flags and the per-token loss: what they do not compose with yet, each with its reason.
void document_violations(const Arguments& a, Violations& v) {
  const DataArguments& d = a.data;
  const bool positions_or_masks = d.reset_position_ids || d.reset_attention_mask;
  v.need(!positions_or_masks || a.parallel.pipeline_model_parallel_size <= 1,
         "--reset-position-ids and --reset-attention-mask need every layer's attention to know the documents, but the "
         "middle pipeline stages read no data: use --pipeline-model-parallel-size 1 with them");
  v.need(!d.sft || a.parallel.pipeline_model_parallel_size <= 1,
         "--sft packs conversations as documents, which every layer's attention must know, but the middle pipeline "
         "stages read no data: use --pipeline-model-parallel-size 1 with --sft");
  v.need(!d.sft || (d.data_path.size() == 1 && !d.mock_data),
         "--sft reads one jsonl file of conversations: give it as --data-path FILE.jsonl (no weights, no --mock-data)");
  v.need(!d.sft || !d.tokenizer_type.empty(),
         "--sft tokenises text: give --tokenizer-type (SFTTokenizer or HuggingFaceTokenizer) and --tokenizer-model");
  v.need(!a.training.calculate_per_token_loss || a.moe.num_experts <= 0,
         "--calculate-per-token-loss with --num-experts: the router losses' gradient scale under per-token loss is not "
         "implemented here yet; drop one of the two");
}

void checkpoint_and_data_violations(const Arguments& a, Violations& v) {
  const CheckpointArguments& c = a.checkpoint;
  v.need(c.save_interval >= 0, "--save-interval must not be negative (got ", c.save_interval, ")");
  v.need(c.keep_last >= 0, "--keep-last must not be negative (got ", c.keep_last, ")");
  v.need(!c.load_fallback_to_intact || !c.load.empty(), "--load-fallback-to-intact needs --load");
  v.need(c.ckpt_step >= 0, "--ckpt-step must not be negative (got ", c.ckpt_step, ")");
  v.need(c.ckpt_step == 0 || !c.load.empty(), "--ckpt-step ", c.ckpt_step, " needs --load");
  v.need(c.ckpt_step == 0 || !c.load_fallback_to_intact, "--ckpt-step ", c.ckpt_step,
         " names the checkpoint to load, --load-fallback-to-intact picks one: give one of the two");
  v.need(c.save_interval == 0 || !c.save.empty(), "--save-interval ", c.save_interval, " needs --save");
  const DataArguments& d = a.data;
  const ModelArguments& m = a.model;
  v.need(d.mock_data || !d.data_path.empty(), "either --data-path or --mock-data is required");
  v.need(!(d.mock_data && !d.data_path.empty()), "--mock-data and --data-path are mutually exclusive");
  if (d.mock_data && d.tokenizer_type.empty())
    v.need(m.vocab_size > 0, "--mock-data without a tokenizer needs --vocab-size");
  if (d.mock_data && m.vocab_size > 0)
    v.need(m.vocab_size >= 4096, "--mock-data draws token ids up to 4095 (Megatron's mock dataset), so --vocab-size ",
           m.vocab_size, " must be at least 4096");
  document_violations(a, v);
}

}  // namespace

std::vector<std::string> constraint_violations(const Arguments& a) {
  std::vector<std::string> out = a.refused;
  Violations v(out);
  model_violations(a.model, v);
  training_violations(a.training, v);
  parallel_violations(a, v);
  pipeline_violations(a, v);
  context_parallel_violations(a, v);
  checkpoint_and_data_violations(a, v);
  for (std::string& s : moe_violations(a)) out.push_back(std::move(s));
  for (std::string& s : fp8_violations(a)) out.push_back(std::move(s));
  for (std::string& s : recompute_violations(a)) out.push_back(std::move(s));
  for (std::string& s : logging_violations(a)) out.push_back(std::move(s));
  for (std::string& s : schedule_violations(a)) out.push_back(std::move(s));
  return out;
}

void resolve_and_validate(Arguments& args) {
  resolve(args);
  std::vector<std::string> v = constraint_violations(args);
  if (v.empty()) return;
  std::string text = str_cat("invalid configuration (", v.size(), v.size() == 1 ? " problem" : " problems", "):");
  for (const std::string& s : v) text += "\n  - " + s;
  throw Error(text);
}

parallel::PipelineSplitConfig pipeline_split_config(const Arguments& args) {
  const ParallelArguments& p = args.parallel;
  return {.num_layers = args.model.num_layers,
          .pipeline_size = p.pipeline_model_parallel_size,
          .virtual_size = p.virtual_pipeline_size,
          .first_stage_layers = p.decoder_first_pipeline_num_layers,
          .last_stage_layers = p.decoder_last_pipeline_num_layers,
          .account_for_embedding = p.account_for_embedding_in_pipeline_split,
          .account_for_loss = p.account_for_loss_in_pipeline_split,
          .layout = p.pipeline_model_parallel_layout};
}

}  // namespace megatron::train
