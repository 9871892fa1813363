#include "megatron/train/flags.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/train/flag_spec.h"
#include "megatron/train/yaml_config.h"

namespace megatron::train {
namespace {

// A flag kept in Arguments whose validation refuses it (with `reason`, a part of the violation's sentence).
FlagSpec refused_by_validation(FlagSpec f, std::string reason) {
  f.status = FlagStatus::Refused;
  f.reason = std::move(reason);
  return f;
}

// A second spelling of `target` (the guides' --fp8 for --fp8-format): same field, not listed in the args.
FlagSpec alias_flag(FlagSpec f, const std::string& target) {
  f.help = "alias of " + target;
  f.reason = "the guides' spelling of " + target;
  f.in_args = false;
  return f;
}

// The flags by group, in the order --help lists them. Each group is its own function so the table stays
// readable as flags are added.
using A = Arguments;
using M = ModelArguments;
using T = TrainingArguments;
using P = ParallelArguments;
using D = DataArguments;
using C = CheckpointArguments;

// The model architecture.
std::vector<FlagSpec> model_flags() {
  return {
      flag("--num-layers", &A::model, &M::num_layers, "transformer layers"),
      flag("--hidden-size", &A::model, &M::hidden_size, "model width h"),
      flag("--num-attention-heads", &A::model, &M::num_attention_heads, "attention heads"),
      flag("--num-query-groups", &A::model, &M::num_query_groups, "key/value groups (GQA); 1 = MQA"),
      flag("--group-query-attention", &A::model, &M::group_query_attention, "use grouped-query attention"),
      flag("--ffn-hidden-size", &A::model, &M::ffn_hidden_size, "MLP width (default 4h, or 8h/3 rounded to 64 with SwiGLU)"),
      flag("--kv-channels", &A::model, &M::kv_channels, "per-head width (default h / heads)"),
      flag("--seq-length", &A::model, &M::seq_length, "tokens per sample"),
      flag("--max-position-embeddings", &A::model, &M::max_position_embeddings, "learned positions (default seq length)"),
      flag("--position-embedding-type", &A::model, &M::position_embedding_type, "position encoding",
           {"learned_absolute", "rope", "none"}),
      flag("--rotary-percent", &A::model, &M::rotary_percent, "fraction of each head rotated by RoPE"),
      flag("--rotary-base", &A::model, &M::rotary_base, "RoPE base"),
      flag("--swiglu", &A::model, &M::swiglu, "SwiGLU MLP"),
      flag("--normalization", &A::model, &M::normalization, "norm layer", {"LayerNorm", "RMSNorm"}),
      flag("--norm-epsilon", &A::model, &M::norm_epsilon, "norm epsilon"),
      flag("--apply-layernorm-1p", &A::model, &M::apply_layernorm_1p,
           "norm weights centred on 0 (initialised to 0): the norm scales by 1 + weight"),
      flag("--untie-embeddings-and-output-weights", &A::model, &M::untie_embeddings_and_output_weights,
           "separate output layer"),
      flag("--disable-bias-linear", &A::model, &M::disable_bias_linear, "no biases in linear layers"),
      flag("--add-qkv-bias", &A::model, &M::add_qkv_bias,
           "biases on the query, key and value projections only (Qwen2), also with --disable-bias-linear"),
      flag("--qk-layernorm", &A::model, &M::qk_layernorm,
           "normalise every query and key head over its channels (--normalization's kind) before RoPE (Qwen3)"),
      flag("--no-position-embedding", &A::model, &M::no_position_embedding,
           "deprecated by Megatron: accepted with --position-embedding-type rope (where it changes nothing)"),
      flag("--attention-dropout", &A::model, &M::attention_dropout, "dropout on attention probabilities"),
      flag("--attention-dropout-masks", &A::model, &M::attention_dropout_masks,
           "who draws attention dropout's masks on GPUs: device (cuDNN's fused generator, the fast default; masks "
           "depend on the layout) or by-index (the CPU's masks by element index, the same bits in every TP/CP "
           "layout; a custom mask costs B*heads*S*S elements per call and a ~3x slower attention backward)",
           {"device", "by-index"}),
      flag("--hidden-dropout", &A::model, &M::hidden_dropout, "dropout on the residual branches"),
      flag("--init-method-std", &A::model, &M::init_method_std, "std of the normal initialisation"),
      flag("--make-vocab-size-divisible-by", &A::model, &M::make_vocab_size_divisible_by, "vocab padding multiple (x TP)"),
      flag("--vocab-size", &A::model, &M::vocab_size, "vocabulary size (mock data / NullTokenizer)"),
  };
}

// Optimisation, precision, logging, evaluation, exits.
std::vector<FlagSpec> training_flags() {
  return {
      flag("--micro-batch-size", &A::training, &T::micro_batch_size, "samples per micro-batch"),
      flag("--global-batch-size", &A::training, &T::global_batch_size, "samples per iteration (all ranks)"),
      flag("--train-iters", &A::training, &T::train_iters, "iterations to train"),
      flag("--lr", &A::training, &T::lr, "peak learning rate"),
      flag("--min-lr", &A::training, &T::min_lr, "learning rate floor"),
      flag("--decoupled-lr", &A::training, &T::decoupled_lr,
           "the word embeddings' and output layer's own peak learning rate (same schedule)"),
      flag("--decoupled-min-lr", &A::training, &T::decoupled_min_lr,
           "their learning rate floor with --decoupled-lr (default --min-lr)"),
      flag("--lr-decay-style", &A::training, &T::lr_decay_style, "schedule",
           {"constant", "linear", "cosine", "inverse-square-root", "WSD"}),
      flag("--lr-warmup-iters", &A::training, &T::lr_warmup_iters, "linear warmup iterations"),
      flag("--lr-decay-iters", &A::training, &T::lr_decay_iters, "decay length (default train iters)"),
      flag("--lr-wsd-decay-style", &A::training, &T::lr_wsd_decay_style, "WSD anneal shape",
           {"exponential", "linear", "cosine", "minus_sqrt"}),
      flag("--lr-wsd-decay-iters", &A::training, &T::lr_wsd_decay_iters, "WSD anneal iterations (end of decay)"),
      flag("--weight-decay", &A::training, &T::weight_decay, "AdamW weight decay"),
      flag("--clip-grad", &A::training, &T::clip_grad, "global gradient-norm clip"),
      flag("--no-check-for-nan-in-loss-and-grad", &A::training, &T::no_check_for_nan_in_loss_and_grad,
           "train on past a NaN or Inf loss or gradient norm (by default the run stops at that iteration and names "
           "the parameters whose gradients are not finite; off by itself under fp16's dynamic loss scaling)"),
      flag("--adam-beta1", &A::training, &T::adam_beta1, "Adam beta1"),
      flag("--adam-beta2", &A::training, &T::adam_beta2, "Adam beta2"),
      flag("--adam-eps", &A::training, &T::adam_eps, "Adam epsilon"),
      flag("--optimizer-cpu-offload", &A::training, &T::optimizer_cpu_offload,
           "keep the optimizer state of --optimizer-offload-fraction of the parameters in host memory and update "
           "them on the CPU"),
      flag("--optimizer-offload-fraction", &A::training, &T::optimizer_offload_fraction,
           "with --optimizer-cpu-offload: the fraction of the parameters (whole tensors, in order) offloaded"),
      flag("--overlap-cpu-optimizer-d2h-h2d", &A::training, &T::overlap_cpu_optimizer_d2h_h2d,
           "with --optimizer-cpu-offload: copy gradients and updated parameters on side streams, pipelined with the "
           "host update (and from the backward with --overlap-grad-reduce)"),
      flag("--use-precision-aware-optimizer", &A::training, &T::use_precision_aware_optimizer,
           "accepted (Megatron needs it with --optimizer-cpu-offload): this AdamW always keeps fp32 masters"),
      flag("--seed", &A::training, &T::seed, "random seed"),
      flag("--bf16", &A::training, &T::bf16, "bf16 parameters, fp32 master weights"),
      flag("--fp16", &A::training, &T::fp16, "fp16 with loss scaling"),
      flag("--loss-scale", &A::training, &T::loss_scale, "static loss scale (fp16; default dynamic)"),
      flag("--initial-loss-scale", &A::training, &T::initial_loss_scale, "first dynamic loss scale"),
      flag("--deterministic-mode", &A::training, &T::deterministic_mode, "bit-identical runs"),
      flag("--calculate-per-token-loss", &A::training, &T::calculate_per_token_loss,
           "every token of the global batch weighs the same: the loss summed over tokens, the gradients divided by "
           "the global batch's token count (over micro-batches and data-parallel ranks)"),
      flag("--device", &A::training, &T::device, "where to train", {"auto", "cpu", "cuda"}),
      flag("--cpu-threads", &A::training, &T::cpu_threads,
           "threads of the CPU kernels (0: OMP_NUM_THREADS if set, else this node's cores divided by its ranks)"),
      flag("--log-interval", &A::training, &T::log_interval, "iterations between log lines"),
      flag("--eval-interval", &A::training, &T::eval_interval, "iterations between evaluations"),
      flag("--eval-iters", &A::training, &T::eval_iters, "iterations per evaluation"),
      flag("--exit-interval", &A::training, &T::exit_interval, "stop at an iteration multiple of this"),
      flag("--exit-duration-in-mins", &A::training, &T::exit_duration_in_mins, "stop after this many minutes"),
      flag("--profile", &A::training, &T::profile,
           "mark iterations for an external profiler (cudaProfilerStart/Stop; e.g. ncu --profile-from-start off)"),
      flag("--profile-step-start", &A::training, &T::profile_step_start, "first profiled iteration"),
      flag("--profile-step-end", &A::training, &T::profile_step_end, "profiling stops before this iteration"),
      flag("--profile-ranks", &A::training, &T::profile_ranks, "global ranks that profile (default 0)"),
      flag("--profile-dir", &A::training, &T::profile_dir,
           "with --profile: each profiled rank writes a Chrome trace (chrome://tracing, Perfetto) of its forward, "
           "backward, send/recv, gradient-reduction and optimizer spans here"),
      flag("--use-pytorch-profiler", &A::training, &T::use_pytorch_profiler,
           "with --profile: the trace also holds every kernel, copy and memset the GPU ran (recorded by CUPTI, as "
           "PyTorch's profiler does in Megatron), one row per stream, and rank 0 prints how busy the GPU was; "
           "written to --profile-dir, else to <--tensorboard-dir>/../torch_profile as Megatron does"),
  };
}

// The planner: --dry-run's memory plan and --dry-run-layouts' search (trainer/memory_plan.h, layout_search.h).
std::vector<FlagSpec> planner_flags() {
  return {
      flag("--dry-run", &A::training, &T::dry_run,
           "ours: validate the flags, print each pipeline rank's predicted memory (model state, activations through "
           "the pipeline schedule, peak) and exit without allocating anything"),
      flag("--dry-run-world-size", &A::training, &T::dry_run_world_size,
           "ours: with --dry-run, plan for this many ranks instead of the launcher's"),
      flag("--dry-run-layouts", &A::training, &T::dry_run_layouts,
           "ours: list the TP x PP x CP x DP layouts (and recomputation) of N GPUs whose planned peak fits, fastest "
           "first by an estimate, and exit"),
      flag("--dry-run-gpu-memory", &A::training, &T::dry_run_gpu_memory,
           "ours: GiB usable per GPU for --dry-run-layouts (default 78: an 80 GB H100)"),
      flag("--dry-run-host-memory", &A::training, &T::dry_run_host_memory,
           "ours: GiB of host memory per node for --dry-run-layouts, which an optimizer offload's pinned state must "
           "fit (default 0: this machine's)"),
      flag("--dry-run-gpus-per-node", &A::training, &T::dry_run_gpus_per_node,
           "ours: GPUs per node sharing that host memory, for --dry-run-layouts (default 8)"),
  };
}

using E = MoeArguments;

// Mixture of Experts (Megatron's names and defaults).
std::vector<FlagSpec> moe_flags() {
  return {
      flag("--num-experts", &A::moe, &E::num_experts, "routed experts per MoE layer (0: a dense model)"),
      flag("--moe-ffn-hidden-size", &A::moe, &E::moe_ffn_hidden_size, "each expert's MLP width (default --ffn-hidden-size)"),
      flag("--moe-router-topk", &A::moe, &E::moe_router_topk, "experts each token is routed to"),
      flag("--moe-router-score-function", &A::moe, &E::moe_router_score_function, "router scores",
           {"softmax", "sigmoid", "sqrtsoftplus"}),
      flag("--moe-router-pre-softmax", &A::moe, &E::moe_router_pre_softmax,
           "softmax over all experts before the top-k (else over the k chosen logits)"),
      flag("--moe-router-num-groups", &A::moe, &E::moe_router_num_groups, "device-limited routing: expert groups"),
      flag("--moe-router-group-topk", &A::moe, &E::moe_router_group_topk, "device-limited routing: groups per token"),
      flag("--moe-router-topk-scaling-factor", &A::moe, &E::moe_router_topk_scaling_factor,
           "multiply the routing probabilities by this"),
      flag("--moe-router-load-balancing-type", &A::moe, &E::moe_router_load_balancing_type,
           "load balancing (one or several; default aux_loss)",
           {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"}),
      flag("--moe-aux-loss-coeff", &A::moe, &E::moe_aux_loss_coeff,
           "coefficient of each load-balancing loss (one for all, or one per type; default 0: off)"),
      flag("--moe-z-loss-coeff", &A::moe, &E::moe_z_loss_coeff, "router z-loss coefficient (default: none)"),
      flag("--moe-router-enable-expert-bias", &A::moe, &E::moe_router_enable_expert_bias,
           "aux-loss-free balancing: a per-expert selection bias updated once per step"),
      flag("--moe-router-bias-update-rate", &A::moe, &E::moe_router_bias_update_rate, "the expert bias's step"),
      flag("--moe-expert-capacity-factor", &A::moe, &E::moe_expert_capacity_factor,
           "expert capacity = ceil(tokens x topk / experts x factor); tokens beyond it are dropped (default: dropless)"),
      flag("--moe-token-drop-policy", &A::moe, &E::moe_token_drop_policy,
           "which tokens an expert over capacity keeps", {"probs", "position"}),
      flag("--moe-pad-expert-input-to-capacity", &A::moe, &E::moe_pad_expert_input_to_capacity,
           "pad every expert's input to its capacity (static shapes)"),
      flag("--moe-token-dispatcher-type", &A::moe, &E::moe_token_dispatcher_type, "token dispatch over EP",
           {"allgather", "alltoall"}),
      flag("--moe-grouped-gemm", &A::moe, &E::moe_grouped_gemm,
           "accepted: the local experts always run as grouped GEMMs here"),
      flag("--moe-expert-gemm", &A::moe, &E::moe_expert_gemm,
           "ours: the local experts' GEMMs on CUDA as one GEMM per expert (default; the faster on Hopper) or one grouped "
           "cuBLAS launch",
           {"grouped", "per-expert"}),
      flag("--moe-shared-expert-intermediate-size", &A::moe, &E::moe_shared_expert_intermediate_size,
           "shared experts' total MLP width (default: none)"),
      flag("--moe-shared-expert-overlap", &A::moe, &E::moe_shared_expert_overlap,
           "overlap the shared experts with the dispatch (alltoall)"),
      flag("--moe-shared-expert-gate", &A::moe, &E::moe_shared_expert_gate,
           "scale the shared experts' output per token by sigmoid(x . gate_weight) (Qwen2-MoE)"),
      flag("--moe-layer-freq", &A::moe, &E::moe_layer_freq,
           "which layers are MoE: every N-th, or a list expression such as \"[0]*2+[1]*6\""),
      flag("--moe-router-dtype", &A::moe, &E::moe_router_dtype, "router dtype: the router always computes in fp32 here (fp64 is refused)", {"fp32", "fp64"}),
      flag("--moe-per-layer-logging", &A::moe, &E::moe_per_layer_logging, "log the MoE losses of every layer"),
  };
}

using F8 = Fp8Arguments;

// FP8 (Megatron's names and defaults; train/fp8_arguments.h has the rules).
std::vector<FlagSpec> fp8_flags() {
  return {
      flag("--fp8-format", &A::fp8, &F8::fp8_format,
           "train the transformer layers' linears in FP8: e4m3 everywhere, or hybrid (e5m2 output gradients)",
           {"e4m3", "hybrid"}),
      alias_flag(flag("--fp8", &A::fp8, &F8::fp8_format, "", {"e4m3", "hybrid"}), "--fp8-format"),
      flag("--fp8-recipe", &A::fp8, &F8::fp8_recipe,
           "scaling: delayed (amax history), tensorwise (current scaling), blockwise (1x128 / 128x128 block "
           "scales); mxfp8 and custom are refused here",
           {"delayed", "tensorwise", "blockwise", "mxfp8", "custom"}),
      flag("--fp8-margin", &A::fp8, &F8::fp8_margin, "scale = fp8_max / amax / 2^margin"),
      flag("--fp8-interval", &A::fp8, &F8::fp8_interval, "deprecated by Transformer Engine: accepted, ignored"),
      flag("--fp8-amax-history-len", &A::fp8, &F8::fp8_amax_history_len, "delayed scaling: amaxes kept per tensor"),
      flag("--fp8-amax-compute-algo", &A::fp8, &F8::fp8_amax_compute_algo,
           "delayed scaling: the history's newest amax or its maximum", {"most_recent", "max"}),
      flag("--fp8-param-gather", &A::fp8, &F8::fp8_param_gather,
           "keep the FP8 linears' weights in FP8 (fp32 masters in the distributed optimizer) and all-gather them in "
           "FP8; needs --use-distributed-optimizer"),
      refused_by_validation(flag("--no-fp8-wgrad", &A::fp8, &F8::no_fp8_wgrad,
                                 "Megatron: the weight-gradient GEMM in higher precision"),
                            "not supported: the weight-gradient GEMM always runs in FP8 here"),
      flag("--first-last-layers-bf16", &A::fp8, &F8::first_last_layers_bf16,
           "keep the first and last layers' linears in bf16 (not with --fp8-recipe delayed)"),
      flag("--num-layers-at-start-in-bf16", &A::fp8, &F8::num_layers_at_start_in_bf16,
           "with --first-last-layers-bf16: layers at the start kept in bf16"),
      flag("--num-layers-at-end-in-bf16", &A::fp8, &F8::num_layers_at_end_in_bf16,
           "with --first-last-layers-bf16: layers at the end kept in bf16"),
      flag("--fp4-format", &A::fp8, &F8::fp4_format, "FP4 training (Blackwell only: refused on Hopper)", {"e2m1"}),
      flag("--fp4-recipe", &A::fp8, &F8::fp4_recipe, "FP4 recipe (Blackwell only)", {"nvfp4", "custom"}),
  };
}

// --tp-comm-overlap, its options, and its off switches, each under Megatron's --disable-* name and its --no-*
// alias.
std::vector<FlagSpec> tp_comm_overlap_flags() {
  std::vector<FlagSpec> out = {
      flag("--tp-comm-overlap", &A::parallel, &P::tp_comm_overlap,
           "with --sequence-parallel: pipeline the TP all-gathers and reduce-scatters with the GEMMs, chunk by chunk"),
      flag("--tp-comm-overlap-rs-dgrad", &A::parallel, &P::tp_comm_overlap_rs_dgrad,
           "with --tp-comm-overlap: pipeline the column-parallel input gradient's reduce-scatter with its GEMM"),
      flag("--tp-comm-overlap-transport", &A::parallel, &P::tp_comm_overlap_transport,
           "ours: with --tp-comm-overlap on GPUs, move the chunks by the copy engines between the GPUs of a node "
           "(falls back to NCCL where the ranks cannot map each other's memory) or by NCCL point-to-point",
           {"copy-engine", "nccl"})};
  const std::pair<const char*, bool P::*> parts[] = {{"overlap-ag", &P::disable_tp_comm_overlap_ag},
                                                     {"overlap-rs", &P::disable_tp_comm_overlap_rs},
                                                     {"bulk-dgrad", &P::disable_tp_comm_bulk_dgrad},
                                                     {"bulk-wgrad", &P::disable_tp_comm_bulk_wgrad},
                                                     {"split-ag", &P::disable_tp_comm_split_ag},
                                                     {"split-rs", &P::disable_tp_comm_split_rs}};
  for (const auto& [part, field] : parts)
    for (const char* prefix : {"--disable-tp-comm-", "--no-tp-comm-"})
      out.push_back(flag(str_cat(prefix, part), &A::parallel, field,
                         str_cat("with --tp-comm-overlap: turn its ", part, " part off")));
  return out;
}

using R = RecomputeArguments;

// Activation recomputation (Megatron's names; train/recompute_arguments.h has the rules).
std::vector<FlagSpec> recompute_flags() {
  return {
      flag("--recompute-activations", &A::recompute, &R::recompute_activations,
           "Megatron's older spelling of --recompute-granularity selective"),
      flag("--recompute-granularity", &A::recompute, &R::recompute_granularity,
           "recompute activations in the backward: full (whole layers) or selective (--recompute-modules)",
           {"full", "selective"}),
      flag("--recompute-method", &A::recompute, &R::recompute_method,
           "full: uniform (every layer, in units of --recompute-num-layers) or block (the first "
           "--recompute-num-layers layers of each chunk)",
           {"uniform", "block"}),
      flag("--recompute-num-layers", &A::recompute, &R::recompute_num_layers,
           "full: layers per unit (uniform) or recomputed layers per pipeline chunk (block)"),
      flag("--recompute-modules", &A::recompute, &R::recompute_modules,
           "selective: the modules recomputed (default core_attn): core_attn, mlp, layernorm, moe_act, moe, shared_experts"),
      flag("--distribute-saved-activations", &A::recompute, &R::distribute_saved_activations,
           "full recompute under TP without SP: split the saved layer inputs over TP, gathered again to recompute"),
  };
}

// Context parallelism: the split, the attention's communication, hybrid (dynamic) CP.
std::vector<FlagSpec> context_parallel_flags() {
  return {
      flag("--context-parallel-size", &A::parallel, &P::context_parallel_size,
           "CP: each sequence split over this many ranks (2 x CP chunks, rank r keeping chunks r and 2CP-1-r)"),
      flag("--cp-comm-type", &A::parallel, &P::cp_comm_type,
           "context-parallel attention: p2p (ring, default), a2a (all-to-all over heads), all_gather (K/V "
           "gathered) or a2a+p2p; one for every layer or one per layer",
           {"p2p", "a2a", "all_gather", "allgather", "a2a+p2p"}),
      flag("--hierarchical-context-parallel-sizes", &A::parallel, &P::hierarchical_context_parallel_sizes,
           "a2a+p2p: the all-to-all group size, then the ring size (product = CP)"),
      flag("--hybrid-context-parallel", &A::parallel, &P::hybrid_context_parallel,
           "packed documents: each micro-batch runs on the fewest CP ranks its longest document needs (a power of "
           "two), the others running other micro-batches meanwhile (needs --max-seqlen-per-dp-cp-rank)"),
      flag("--dynamic-context-parallel", &A::parallel, &P::hybrid_context_parallel,
           "the same as --hybrid-context-parallel (the name NVIDIA's blog uses)"),
      flag("--max-seqlen-per-dp-cp-rank", &A::parallel, &P::max_seqlen_per_dp_cp_rank,
           "hybrid context parallelism: the tokens of one document one CP rank takes"),
      flag("--cp-comm-transport", &A::parallel, &P::cp_comm_transport,
           "ours: how the p2p ring moves its key/value and gradient blocks on GPUs: nccl (point-to-point) or "
           "copy-engine (peer memcpys between the GPUs of a node, falling back to NCCL where the ranks cannot map "
           "each other's memory)",
           {"nccl", "copy-engine"}),
  };
}

// The parallel layout and data-parallel options.
std::vector<FlagSpec> parallel_flags() {
  return {
      flag("--tensor-model-parallel-size", &A::parallel, &P::tensor_model_parallel_size,
           "TP: split attention heads (whole query groups), MLP columns and the vocabulary over N adjacent ranks"),
      flag("--pipeline-model-parallel-size", &A::parallel, &P::pipeline_model_parallel_size,
           "PP: split the layers into stages over N ranks (the slowest-varying rank coordinate)"),
      flag("--num-layers-per-virtual-pipeline-stage", &A::parallel, &P::num_layers_per_virtual_pipeline_stage,
           "interleaved schedule: layers per model chunk"),
      flag("--virtual-pipeline-model-parallel-size", &A::parallel, &P::virtual_pipeline_model_parallel_size,
           "interleaved schedule: model chunks per pipeline rank"),
      flag("--num-virtual-stages-per-pipeline-rank", &A::parallel, &P::num_virtual_stages_per_pipeline_rank,
           "interleaved schedule: model chunks per pipeline rank (newer Megatron's name)"),
      flag("--decoder-first-pipeline-num-layers", &A::parallel, &P::decoder_first_pipeline_num_layers,
           "uneven split: transformer layers of the first pipeline stage"),
      flag("--decoder-last-pipeline-num-layers", &A::parallel, &P::decoder_last_pipeline_num_layers,
           "uneven split: transformer layers of the last pipeline stage"),
      flag("--account-for-embedding-in-pipeline-split", &A::parallel, &P::account_for_embedding_in_pipeline_split,
           "count the embedding as one layer of the first stage when splitting"),
      flag("--account-for-loss-in-pipeline-split", &A::parallel, &P::account_for_loss_in_pipeline_split,
           "count the output layer and loss as one layer of the last stage when splitting"),
      flag("--pipeline-model-parallel-layout", &A::parallel, &P::pipeline_model_parallel_layout,
           "every virtual stage's layers, stages in order, e.g. \"Et*9|t*8|t*8|t*7L\" (E embedding, t transformer "
           "layer, L loss, | between stages, x*n and (...)*n repeat); PP x V stages set the interleaving"),
      flag("--microbatch-group-size-per-virtual-pipeline-stage", &A::parallel,
           &P::microbatch_group_size_per_virtual_pipeline_stage,
           "interleaved schedule: consecutive micro-batches per model chunk (default: the pipeline size)"),
      flag("--no-overlap-p2p-communication", &A::parallel, &P::no_overlap_p2p_communication,
           "wait for each pipeline send/recv where it is posted instead of just before its data is used; the "
           "interleaved schedule then also batches a forward's send with the following backward's"),
      flag("--expert-model-parallel-size", &A::parallel, &P::expert_model_parallel_size,
           "EP: the experts of each MoE layer split over this many ranks (folded over DP x CP x TP)"),
      flag("--expert-tensor-parallel-size", &A::parallel, &P::expert_tensor_parallel_size,
           "ETP: each expert's MLP split over this many ranks (default: --tensor-model-parallel-size)"),
      flag("--sequence-parallel", &A::parallel, &P::sequence_parallel,
           "with TP > 1: norms, dropout and the residual stream hold 1/TP of the tokens (all-gather before, "
           "reduce-scatter after the parallel layers); ignored at TP 1, as in Megatron"),
      flag("--use-distributed-optimizer", &A::parallel, &P::use_distributed_optimizer, "shard optimizer state over DP"),
      flag("--use-megatron-fsdp", &A::parallel, &P::use_megatron_fsdp,
           "Megatron FSDP: gradient buckets per module group (embedding, each layer, output head), sharded over DP "
           "as --data-parallel-sharding-strategy says (the distributed optimizer's checkpoint layout)"),
      flag("--data-parallel-sharding-strategy", &A::parallel, &P::data_parallel_sharding_strategy,
           "with --use-megatron-fsdp, what persists only as 1/DP shards: no_shard (nothing), optim (the optimizer "
           "state), optim_grads (and the gradients, reduce-scattered per module group in every backward), "
           "optim_grads_params (and the parameters, all-gathered per module group around each use)",
           {"no_shard", "optim", "optim_grads", "optim_grads_params"}),
      flag("--overlap-grad-reduce", &A::parallel, &P::overlap_grad_reduce, "reduce gradients during backward"),
      flag("--overlap-param-gather", &A::parallel, &P::overlap_param_gather,
           "gather parameters during forward (CUDA; on CPU ranks the gather completes in the optimizer step)"),
      flag("--ddp-bucket-size", &A::parallel, &P::ddp_bucket_size,
           "gradient elements per reduction bucket (default max(40M, 1M x DP) with --overlap-grad-reduce, else one)"),
      flag("--accumulate-allreduce-grads-in-fp32", &A::parallel, &P::accumulate_allreduce_grads_in_fp32,
           "accepted for Megatron scripts: gradients are always accumulated and reduced in fp32 here"),
      flag("--distributed-timeout-minutes", &A::parallel, &P::distributed_timeout_minutes,
           "a collective waiting longer reports the rank, group and sizes and ends the run (fractions allowed)"),
      flag("--distributed-backend", &A::parallel, &P::distributed_backend,
           "collectives of GPU ranks (CPU ranks use MPI, or TCP sockets under torchrun: gloo and mpi mean that)",
           {"nccl", "mpi", "gloo"}),
  };
}

// Datasets and tokenizers.
std::vector<FlagSpec> data_flags() {
  return {
      flag("--data-path", &A::data, &D::data_path, "[weight] prefix pairs"),
      flag("--split", &A::data, &D::split, "train,valid,test proportions"),
      flag("--mock-data", &A::data, &D::mock_data, "synthetic data"),
      flag("--reset-position-ids", &A::data, &D::reset_position_ids,
           "positions restart at 0 after every end-of-document token (docs/data.md)"),
      flag("--reset-attention-mask", &A::data, &D::reset_attention_mask,
           "tokens attend only inside their own document: a sequence's documents end at its EOD tokens (docs/data.md)"),
      flag("--eod-mask-loss", &A::data, &D::eod_mask_loss, "no loss on end-of-document tokens (docs/data.md)"),
      flag("--sft", &A::data, &D::sft,
           "supervised fine-tuning: --data-path is a jsonl of conversations, packed, loss on assistant tokens "
           "(docs/data.md)"),
      flag("--sft-tokenizer-prompt-format", &A::data, &D::sft_tokenizer_prompt_format,
           "--sft chat format; default: the tokenizer's chat_template recognised as llama3 or chatml (docs/data.md)",
           {"nemotron-h-aligned", "default", "identity", "llama3", "chatml"}),
      flag("--tokenizer-type", &A::data, &D::tokenizer_type,
           "tokenizer (Llama3Tokenizer: Llama 3's tiktoken tokenizer.model with its pattern and 256 special tokens; "
           "Llama2Tokenizer: a sentencepiece model, as GPTSentencePieceTokenizer)",
           {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SFTTokenizer", "TikTokenizer", "Llama3Tokenizer", "SentencePieceTokenizer",
            "GPTSentencePieceTokenizer", "Llama2Tokenizer", "NullTokenizer"}),
      flag("--tiktoken-pattern", &A::data, &D::tiktoken_pattern, "TikTokenizer: the pre-tokenisation pattern", {"v1", "v2"}),
      flag("--tiktoken-num-special-tokens", &A::data, &D::tiktoken_num_special_tokens,
           "TikTokenizer: special tokens before the ranks (Megatron's layout; 0: after the ranks, as tiktoken files hold them)"),
      flag("--tiktoken-special-tokens", &A::data, &D::tiktoken_special_tokens, "TikTokenizer: the special tokens"),
      flag("--vocab-file", &A::data, &D::vocab_file, "vocab.json"),
      flag("--merge-file", &A::data, &D::merge_file, "merges.txt"),
      flag("--tokenizer-model", &A::data, &D::tokenizer_model, "tokenizer model file"),
      flag("--data-cache-path", &A::data, &D::data_cache_path, "where dataset indices are cached"),
      flag("--yaml-cfg", &A::data, &D::yaml_cfg,
           "Megatron's YAML configuration instead of the command line (top-level arguments, language_model and "
           "model_parallel sections; train/yaml_config.h)"),
  };
}

// Checkpoints.
std::vector<FlagSpec> checkpoint_flags() {
  return {
      flag("--save", &A::checkpoint, &C::save,
           "checkpoint directory to write (every rank writes its own shard file; ranks need a shared filesystem)"),
      flag("--load", &A::checkpoint, &C::load,
           "checkpoint directory to read (saved at any data-parallel layout, with or without the distributed optimizer)"),
      flag("--save-interval", &A::checkpoint, &C::save_interval, "iterations between checkpoints"),
      flag("--no-save-optim", &A::checkpoint, &C::no_save_optim, "do not save the optimizer state"),
      flag("--no-save-rng", &A::checkpoint, &C::no_save_rng, "do not save the RNG state"),
      flag("--no-load-optim", &A::checkpoint, &C::no_load_optim, "do not load the optimizer state"),
      flag("--no-load-rng", &A::checkpoint, &C::no_load_rng, "do not load the RNG state (use --seed)"),
      flag("--finetune", &A::checkpoint, &C::finetune,
           "load the model weights only; start at iteration 0 with fresh optimizer, schedule and data position"),
      flag("--async-save", &A::checkpoint, &C::async_save,
           "the training thread only queues copies into reusable pinned host buffers (the next optimizer step waits "
           "for them on the device); a background thread writes while training goes on"),
      flag("--keep-last", &A::checkpoint, &C::keep_last, "keep only the newest N checkpoints (0: keep all)"),
      flag("--ckpt-step", &A::checkpoint, &C::ckpt_step,
           "load this iteration of --load (its iter_NNNNNNN directory) instead of the one the tracker names"),
      flag("--load-fallback-to-intact", &A::checkpoint, &C::load_fallback_to_intact,
           "ours: check every shard of --load's checkpoint before loading it (one extra read, shared by the ranks); "
           "when one is missing, cut short or corrupt, resume from the newest intact older checkpoint instead of "
           "stopping"),
      flag("--use-checkpoint-args", &A::checkpoint, &C::use_checkpoint_args,
           "take the model's arguments (architecture, vocabulary, MoE) from the --load checkpoint's saved args"),
  };
}

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = [] {
    std::vector<FlagSpec> all;
    // The order matters where two flags are as near to a mistyped one (nearest_flag takes the first): the
    // layout's flags (TP, PP) come before context parallelism's, as in Megatron's argument groups.
    for (auto group : {&model_flags, &moe_flags, &fp8_flags, &recompute_flags, &tp_comm_overlap_flags,
                       &training_flags, &planner_flags, &schedule_flags, &logging_flags, &parallel_flags, &context_parallel_flags,
                       &data_flags, &checkpoint_flags, &compat_flags})
      for (FlagSpec& f : group()) all.push_back(std::move(f));
    return all;
  }();
  return table;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// Byte counts folded into 32 buckets. Half their L1 distance is a lower bound of the edit distance (an
// insertion or deletion changes it by 1, a substitution by at most 2), and costs 32 steps, not |a| x |b|.
using Histogram = std::array<int, 32>;
Histogram histogram(const std::string& s) {
  Histogram h{};
  for (unsigned char c : s) ++h[c % 32];
  return h;
}
size_t histogram_bound(const Histogram& a, const Histogram& b) {
  size_t l1 = 0;
  for (size_t i = 0; i < a.size(); ++i) l1 += size_t(std::abs(a[i] - b[i]));
  return (l1 + 1) / 2;
}

// The edit distance when it is at most `bound`, else bound + 1: stops as soon as a whole row of the table
// exceeds the bound (its minimum never decreases down the rows).
size_t edit_distance_at_most(const std::string& a, const std::string& b, size_t bound) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    size_t row_min = cur[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      row_min = std::min(row_min, cur[j]);
    }
    if (row_min > bound) return bound + 1;
    std::swap(prev, cur);
  }
  return std::min(prev[b.size()], bound + 1);
}

}  // namespace

std::string nearest_flag(const std::string& unknown) {
  static const std::vector<Histogram> flag_histograms = [] {
    std::vector<Histogram> out;
    for (const FlagSpec& f : flag_table()) out.push_back(histogram(f.name));
    return out;
  }();
  const size_t limit = std::max<size_t>(3, unknown.size() / 3);  // farther is not a typo of that flag
  const Histogram mine = histogram(unknown);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (size_t i = 0; i < flag_table().size(); ++i) {
    const std::string& name = flag_table()[i].name;
    // Cheap lower bounds first (the length difference, the histograms): the full distance only for flags
    // that may be within reach.
    if (std::max(unknown.size(), name.size()) - std::min(unknown.size(), name.size()) > limit) continue;
    const size_t bound = histogram_bound(mine, flag_histograms[i]);
    if (bound > limit || bound >= best_distance) continue;
    const size_t d = edit_distance_at_most(unknown, name, std::min(limit, best_distance - 1));
    if (d < best_distance && d <= limit) best_distance = d, best = name;
  }
  return best_distance <= limit ? best : "";
}

// --yaml-cfg FILE stands for the whole command line (train/yaml_config.h): its flags, or an error when other
// flags are given too (Megatron would ignore them).
std::optional<std::vector<std::string>> yaml_command_line(const std::vector<std::string>& argv) {
  std::string path;
  std::vector<std::string> others;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--yaml-cfg" && i + 1 < argv.size()) path = argv[++i];
    else if (argv[i].rfind("--yaml-cfg=", 0) == 0) path = argv[i].substr(11);
    else if (argv[i].rfind("--", 0) == 0) others.push_back(argv[i]);
  }
  if (path.empty()) return std::nullopt;
  if (!others.empty()) {
    std::string list;
    for (const std::string& o : others) list += (list.empty() ? "" : " ") + o;
    MEGATRON_FAIL("--yaml-cfg ", path, " replaces the whole command line (Megatron ignores the other arguments); "
                  "move these into the file: ", list);
  }
  return yaml_config_flags(path);
}

Arguments parse_arguments(const std::vector<std::string>& argv) {
  if (const auto from_yaml = yaml_command_line(argv)) {
    Arguments args = parse_arguments(*from_yaml);
    return args;
  }
  Arguments args;
  std::vector<std::string> problems;
  const auto& table = flag_table();
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string token = argv[i];
    if (token.rfind("--", 0) != 0) {
      problems.push_back(str_cat("unexpected argument '", token, "' (flags start with --)"));
      continue;
    }
    std::string name = token, inline_value;
    bool has_inline = false;
    if (size_t eq = token.find('='); eq != std::string::npos) {
      name = token.substr(0, eq);
      inline_value = token.substr(eq + 1);
      has_inline = true;
    }
    auto it = std::find_if(table.begin(), table.end(), [&](const FlagSpec& f) { return f.name == name; });
    if (it == table.end()) {
      std::string near = nearest_flag(name);
      problems.push_back(str_cat("unknown flag ", name, near.empty() ? "" : str_cat("; did you mean ", near, "?")));
      // Skip the values that follow an unknown flag.
      while (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) ++i;
      continue;
    }
    const FlagSpec& f = *it;
    std::vector<std::string> values;
    if (!f.takes_value) {
      if (has_inline) problems.push_back(str_cat(name, " is a switch and takes no value (got '", inline_value, "')"));
    } else if (has_inline) {
      values.push_back(inline_value);
    } else {
      while (i + 1 < argv.size() && (argv[i + 1].rfind("--", 0) != 0 || argv[i + 1].size() == 2)) {
        values.push_back(argv[++i]);
        if (!f.takes_list) break;
      }
      if (values.empty()) {
        problems.push_back(str_cat(name, " needs a value"));
        continue;
      }
    }
    if (!f.takes_value) values.push_back("");
    for (const std::string& v : values) {
      if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), v) == f.choices.end()) {
        std::string set;
        for (const auto& c : f.choices) set += (set.empty() ? "" : ", ") + c;
        problems.push_back(str_cat(name, " '", v, "' is not one of {", set, "}"));
        continue;
      }
      std::string error = f.set(args, v);
      if (!error.empty()) problems.push_back(str_cat(name, " ", error));
    }
  }
  if (!problems.empty()) {
    std::string text = str_cat("invalid command line (", problems.size(), problems.size() == 1 ? " problem" : " problems", "):");
    for (const auto& p : problems) text += "\n  - " + p;
    throw Error(text);
  }
  return args;
}

std::string flags_help() {
  std::ostringstream os;
  Arguments defaults;
  for (const FlagSpec& f : flag_table()) {
    os << "  " << f.name;
    if (f.takes_value) os << (f.takes_list ? " VALUE..." : " VALUE");
    os << "\n      " << f.help;
    if (f.status != FlagStatus::Supported) os << (f.help.empty() ? "" : " ") << "[" << flag_status_name(f.status) << ": " << f.reason << "]";
    if (!f.choices.empty()) {
      os << " {";
      for (size_t i = 0; i < f.choices.size(); ++i) os << (i ? ", " : "") << f.choices[i];
      os << "}";
    }
    std::string d = f.get(defaults);
    if (f.takes_value && !d.empty() && d != "0") os << " (default " << d << ")";
    os << "\n";
  }
  return os.str();
}

// Checkpoints: arguments as (key, value) pairs and back.
namespace {
std::string flag_key(const std::string& flag_name) {
  std::string key = flag_name.substr(2);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> argument_values(const Arguments& args) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const FlagSpec& f : flag_table())
    if (f.in_args) rows.emplace_back(flag_key(f.name), f.get(args));
  return rows;
}

std::vector<std::string> flags_for_values(const std::vector<std::pair<std::string, std::string>>& values) {
  std::vector<std::string> argv;
  for (const auto& [key, value] : values)
    for (const FlagSpec& f : flag_table()) {
      if (flag_key(f.name) != key) continue;
      if (!f.takes_value) {
        if (value == "True") argv.push_back(f.name);
      } else if (f.takes_list) {
        if (value.empty()) break;
        argv.push_back(f.name);
        size_t start = 0;
        while (start <= value.size()) {
          size_t space = value.find(' ', start);
          if (space == std::string::npos) space = value.size();
          argv.push_back(value.substr(start, space - start));
          start = space + 1;
        }
      } else {
        argv.push_back(f.name);
        argv.push_back(value);
      }
      break;
    }
  return argv;
}

std::vector<FlagStatusRow> flag_statuses() {
  std::vector<FlagStatusRow> rows;
  for (const FlagSpec& f : flag_table())
    rows.push_back({f.name, flag_status_name(f.status),
                    f.status == FlagStatus::Supported && f.reason.empty() ? f.help : f.reason, f.takes_value, f.takes_list});
  return rows;
}

std::string describe_arguments(const Arguments& args) {
  std::vector<std::pair<std::string, std::string>> rows = argument_values(args);
  rows.emplace_back("world_size", std::to_string(args.parallel.world_size));
  rows.emplace_back("data_parallel_size", std::to_string(args.data_parallel_size()));
  rows.emplace_back("padded_vocab_size", std::to_string(args.padded_vocab_size()));
  std::sort(rows.begin(), rows.end());
  std::ostringstream os;
  os << "------------------------ arguments ------------------------\n";
  for (const auto& [k, v] : rows) {
    std::string dots(std::max<int>(3, 48 - int(k.size())), '.');
    os << "  " << k << " " << dots << " " << v << "\n";
  }
  os << "-------------------- end of arguments ---------------------\n";
  return os.str();
}

}  // namespace megatron::train
