// The resolved configuration of a training run, in Megatron-LM's terms. Field names follow the flags
// (--hidden-size -> hidden_size); defaults are Megatron's (megatron/training/arguments.py), so a user's
// script means the same thing here. Parsing lives in flags.h, cross-field rules in validate().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/parallel/pipeline_split.h"

namespace megatron::train {

struct ModelArguments {
  int num_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_query_groups = 0;          // 0 = num_attention_heads (MHA); set by --num-query-groups
  bool group_query_attention = false;
  int ffn_hidden_size = 0;           // 0 = 4 * hidden_size, or Megatron's SwiGLU default (see resolve())
  int kv_channels = 0;               // 0 = hidden_size / num_attention_heads
  int seq_length = 0;
  int max_position_embeddings = 0;   // 0 = seq_length
  std::string position_embedding_type = "learned_absolute";  // learned_absolute | rope | none
  double rotary_percent = 1.0;
  double rotary_base = 10000;
  bool swiglu = false;
  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;  // norm weights centred on 0: the norm scales by 1 + weight
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;         // biases on linear_qkv even with --disable-bias-linear (Qwen2)
  bool qk_layernorm = false;         // per-head norms of queries and keys before RoPE (Qwen3)
  bool no_position_embedding = false;  // Megatron's deprecated switch: only with rope, where it changes nothing
  double attention_dropout = 0.1;
  std::string attention_dropout_masks = "device";  // device (cuDNN's generator on GPUs) | by-index
  double hidden_dropout = 0.1;
  double init_method_std = 0.02;
  int make_vocab_size_divisible_by = 128;
  int vocab_size = 0;                // from the tokenizer, or --vocab-size (mock data / NullTokenizer)
};

// Mixture of Experts (Megatron's --num-experts and --moe-* flags; defaults are Megatron's). Fields that
// Megatron leaves None are 0 here.
struct MoeArguments {
  int num_experts = 0;                       // 0: dense
  int moe_ffn_hidden_size = 0;               // 0: --ffn-hidden-size
  int moe_router_topk = 2;
  std::string moe_router_score_function = "softmax";  // softmax | sigmoid | sqrtsoftplus
  bool moe_router_pre_softmax = false;
  int moe_router_num_groups = 0;
  int moe_router_group_topk = 0;
  double moe_router_topk_scaling_factor = 0;
  std::vector<std::string> moe_router_load_balancing_type;  // empty: aux_loss
  std::vector<double> moe_aux_loss_coeff;    // empty: 0 (off); one per load-balancing type, or one for all
  double moe_z_loss_coeff = 0;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  double moe_expert_capacity_factor = 0;     // 0: dropless
  std::string moe_token_drop_policy = "probs";  // probs | position
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_dispatcher_type = "allgather";  // allgather | alltoall
  bool moe_grouped_gemm = false;             // accepted: the experts always run as grouped GEMMs here
  // ours: per-expert (one cuBLAS GEMM per local expert: 85-99% of a dense GEMM on an H200) | grouped (one
  // cublasGemmGroupedBatchedEx launch: ~40% of dense there)
  std::string moe_expert_gemm = "per-expert";
  int moe_shared_expert_intermediate_size = 0;
  bool moe_shared_expert_overlap = false;
  bool moe_shared_expert_gate = false;       // the shared experts' output times a per-token sigmoid gate
  std::string moe_layer_freq = "1";          // an int N (every N-th layer) or a Python list pattern "[0]*2+[1]*6"
  std::string moe_router_dtype;              // "" (the model dtype), fp32 or fp64
  bool moe_per_layer_logging = false;
};

// FP8 (Megatron's --fp8-* flags, which it hands to Transformer Engine; defaults are Megatron's, not TE's).
struct Fp8Arguments {
  std::string fp8_format;                // "" (off), e4m3 or hybrid
  std::string fp8_recipe = "delayed";    // delayed | tensorwise | blockwise | mxfp8 | custom
  int fp8_margin = 0;
  int fp8_interval = 1;                  // deprecated in Transformer Engine; accepted and ignored
  int fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
  bool fp8_param_gather = false;
  bool no_fp8_wgrad = false;             // refused: the weight gradient always runs in FP8 here
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  std::string fp4_format;                // "" or e2m1 (Blackwell only: refused here)
  std::string fp4_recipe = "nvfp4";
};

// Activation recomputation (Megatron's --recompute-* flags; train/recompute_arguments.h has the rules).
struct RecomputeArguments {
  bool recompute_activations = false;       // Megatron's older spelling of --recompute-granularity selective
  std::string recompute_granularity;        // "" (off), full or selective
  std::string recompute_method;             // "", uniform or block (full granularity)
  int recompute_num_layers = 0;             // 0: not given (Megatron's None)
  std::vector<std::string> recompute_modules;  // selective: empty = Megatron's default, core_attn
  bool distribute_saved_activations = false;
};

// What a run reports and how it leaves (Megatron's logging, timing, TensorBoard, straggler and exit-signal
// flags; train/logging_arguments.h has their rules, docs/observability.md what each shows).
struct LoggingArguments {
  int timing_log_level = 0;                  // 0: none; 1: once-per-iteration timers; 2: per micro-batch too
  std::string timing_log_option = "minmax";  // max | minmax | all
  bool log_throughput = false;               // the log line always shows it; this adds TensorBoard's "throughput"
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  std::string tensorboard_dir;               // "" : no event files
  int tensorboard_log_interval = 1;
  int tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool no_log_loss_scale_to_tensorboard = false;  // Megatron's --no-log-loss-scale-to-tensorboard
  bool log_straggler = false;
  int straggler_minmax_count = 1;
  int straggler_ctrlr_port = 65535;
  bool disable_straggler_on_startup = false;
  bool exit_signal_handler = false;
  std::string exit_signal = "SIGTERM";       // the signal --exit-signal-handler catches (SIGINT is caught too)
};

struct TrainingArguments {
  int micro_batch_size = 1;
  int global_batch_size = 0;         // 0 = micro_batch_size * data_parallel_size
  int64_t train_iters = 0;
  double lr = 0;
  double min_lr = 0;
  // Megatron's --decoupled-lr / --decoupled-min-lr (-1: not given): the word embeddings' and output layer's own
  // peak and floor learning rates on the same schedule (optim/param_groups.h); the floor defaults to --min-lr.
  double decoupled_lr = -1;
  double decoupled_min_lr = -1;
  std::string lr_decay_style = "linear";  // constant | linear | cosine | inverse-square-root | WSD
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;        // 0 = train_iters
  std::string lr_wsd_decay_style = "exponential";  // WSD anneal shape: exponential | linear | cosine | minus_sqrt
  int64_t lr_wsd_decay_iters = 0;    // WSD anneal length, the last iterations of lr_decay_iters (required for WSD)
  double weight_decay = 0.01;
  // Sample-based training and schedules (Megatron's; train/schedule_arguments.h has the rules). Megatron's
  // None is 0 for the counts and -1 for the values that may legitimately be 0.
  int64_t train_samples = 0;             // instead of --train-iters: train_iters is derived (resolve())
  int64_t lr_decay_samples = 0;          // 0: --train-samples
  int64_t lr_warmup_samples = 0;
  double lr_warmup_fraction = -1;        // -1: not given; else the warmup is this fraction of the decay
  double lr_warmup_init = 0.0;           // the warmup's first learning rate
  int64_t lr_wsd_decay_samples = 0;
  double start_weight_decay = -1;        // -1: not given (--weight-decay when the increment style is constant)
  double end_weight_decay = -1;
  std::string weight_decay_incr_style = "constant";  // constant | linear | cosine
  std::vector<int> rampup_batch_size;    // start, increment, ramp-up samples (Megatron before its removal)
  std::string step_batch_size_schedule;  // "THRESHOLD:BS ..." (thresholds in tokens; K/M/B/T suffixes)
  bool iterations_from_samples = false;  // resolved: train_iters was derived from --train-samples
  bool global_batch_size_defaulted = false;  // resolved: --global-batch-size was not given (mbs x DP)
  double clip_grad = 1.0;
  // Megatron's --no-check-for-nan-in-loss-and-grad: by default a NaN or Inf loss or gradient norm stops the run
  // (trainer/finite_check.h); resolve() sets it under fp16's dynamic loss scaling, where an overflow skips the step.
  bool no_check_for_nan_in_loss_and_grad = false;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  bool dry_run = false;                      // print the memory plan (trainer/memory_plan.h) and exit
  int dry_run_world_size = 0;                // the world the plan is for (0: the launcher's)
  int dry_run_layouts = 0;                   // > 0: list the layouts of this many GPUs that fit (layout_search.h)
  double dry_run_gpu_memory = 78;            // GiB usable per GPU for that list (an 80 GB H100 less its context)
  double dry_run_host_memory = 0;            // GiB of host memory per node for that list (0: this machine's)
  int dry_run_gpus_per_node = 8;             // the GPUs sharing one node's host memory, for that list
  bool optimizer_cpu_offload = false;        // masters and moments of a fraction of the parameters on the host
  double optimizer_offload_fraction = 1.0;   // Megatron's default: all of them
  bool overlap_cpu_optimizer_d2h_h2d = false;  // side-stream transfers of the offloaded update (optim/adamw.h)
  bool use_precision_aware_optimizer = false;  // accepted: this AdamW always keeps its own fp32 masters
  int64_t seed = 1234;
  bool bf16 = false;
  bool fp16 = false;
  double loss_scale = 0;             // 0 = dynamic (fp16)
  double initial_loss_scale = 4294967296.0;
  bool deterministic_mode = false;
  // --calculate-per-token-loss: each micro-batch's loss is its sum over tokens and the gradients are divided
  // by the global batch's token count (over micro-batches and DP x CP) once, after their reduction.
  bool calculate_per_token_loss = false;
  std::string device = "auto";       // auto | cpu | cuda
  int cpu_threads = 0;               // CPU kernels' threads; 0 = OMP_NUM_THREADS, else the node's cores / local ranks
  int log_interval = 100;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t exit_interval = 0;
  double exit_duration_in_mins = 0;
  bool profile = false;              // mark iterations [profile_step_start, profile_step_end) for a profiler
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int> profile_ranks;    // the global ranks that profile (Megatron's --profile-ranks; empty: rank 0)
  std::string profile_dir;           // ours: each profiled rank writes a Chrome trace of its spans here
  bool use_pytorch_profiler = false;  // the trace also holds the GPU's kernels and copies (CUPTI), as Megatron's
};

struct ParallelArguments {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int context_parallel_size = 1;
  // Context parallelism's communication: one type for every layer or one per layer (p2p, a2a, all_gather
  // or allgather, a2a+p2p; empty: p2p, Megatron's default), and for a2a+p2p the all-to-all and ring sizes.
  std::vector<std::string> cp_comm_type;
  std::vector<int> hierarchical_context_parallel_sizes;
  // Megatron-Core's hybrid (dynamic) context parallelism: each packed micro-batch runs on as many of the CP ranks as
  // its longest document needs at --max-seqlen-per-dp-cp-rank tokens a rank (parallel/dynamic_cp_schedule.h), the
  // others running other micro-batches meanwhile.
  bool hybrid_context_parallel = false;
  int64_t max_seqlen_per_dp_cp_rank = 0;
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 0;  // 0: --tensor-model-parallel-size (Megatron's default)
  bool sequence_parallel = false;
  // --tp-comm-overlap and the switches that turn its parts off (parallel/tp_comm_overlap.h).
  bool tp_comm_overlap = false;
  bool disable_tp_comm_overlap_ag = false;
  bool disable_tp_comm_overlap_rs = false;
  bool disable_tp_comm_bulk_dgrad = false;
  bool disable_tp_comm_bulk_wgrad = false;
  bool disable_tp_comm_split_ag = false;
  bool disable_tp_comm_split_rs = false;
  bool tp_comm_overlap_rs_dgrad = false;
  // Ours: how the pipelined collectives move their chunks on GPUs: "copy-engine" (peer memcpys between the GPUs
  // of a node, falling back to NCCL where the ranks cannot map each other's memory) or "nccl".
  std::string tp_comm_overlap_transport = "copy-engine";
  // Ours: how the p2p ring of context parallelism moves its blocks on GPUs: "nccl" or "copy-engine".
  std::string cp_comm_transport = "nccl";
  bool use_distributed_optimizer = false;
  // Megatron FSDP: module-group buckets, and what of them persists only as 1/DP shards (Megatron's default
  // strategy; with --use-megatron-fsdp every strategy but no_shard implies the distributed optimizer).
  bool use_megatron_fsdp = false;
  std::string data_parallel_sharding_strategy = "optim_grads_params";
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  double distributed_timeout_minutes = 10;  // a collective waiting longer ends the run (fractions allowed)
  int64_t ddp_bucket_size = 0;       // elements per gradient bucket; 0 = Megatron's max(40M, 1M x DP)
  bool accumulate_allreduce_grads_in_fp32 = false;  // accepted; gradients are always accumulated and reduced in fp32
  std::string distributed_backend = "nccl";  // nccl on GPUs; CPU ranks: MPI, or sockets under torchrun
  int world_size = 1;                // from the launcher (MPI), not a flag
  // Pipeline parallelism (Megatron's names). The virtual size comes from at most one of the three flags;
  // 0 / -1 mean "not given".
  int num_layers_per_virtual_pipeline_stage = 0;
  int virtual_pipeline_model_parallel_size = 0;   // older Megatron scripts' spelling
  int num_virtual_stages_per_pipeline_rank = 0;   // newer Megatron's spelling of the same
  int decoder_first_pipeline_num_layers = -1;     // uneven split: layers of the first stage
  int decoder_last_pipeline_num_layers = -1;      // uneven split: layers of the last stage
  bool account_for_embedding_in_pipeline_split = false;  // the embedding counts as a layer of the first stage
  bool account_for_loss_in_pipeline_split = false;       // the loss counts as a layer of the last stage
  std::string pipeline_model_parallel_layout;            // every virtual stage's layers ("Et*9|t*8|t*8|t*7L")
  int microbatch_group_size_per_virtual_pipeline_stage = 0;  // 0: the pipeline size (Megatron's default)
  bool no_overlap_p2p_communication = false;      // wait for each point-to-point batch where it is posted

  // Resolved by resolve(): the model chunks per pipeline rank (1 without interleaving).
  int virtual_pipeline_size = 1;
};

struct DataArguments {
  std::vector<std::string> data_path;  // "[weight] prefix" pairs as typed
  std::string split = "969, 30, 1";
  bool mock_data = false;
  std::string tokenizer_type;
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_model;
  std::string data_cache_path;
  // Megatron's document flags (data/document_masks.h): positions restart after every EOD, attention stays
  // inside each document, no loss on EOD tokens.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  // Supervised fine-tuning (data/sft/sft_dataset.h): --data-path names a jsonl of conversations, tokenised
  // with the chat format --sft-tokenizer-prompt-format and packed; loss on the assistant tokens only.
  bool sft = false;
  std::string sft_tokenizer_prompt_format = "nemotron-h-aligned";  // Megatron's default
  std::string yaml_cfg;                 // --yaml-cfg: the flags came from this file (train/yaml_config.h)
  std::string tiktoken_pattern = "v2";  // TikTokenizer (as preprocess_data)
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> tiktoken_special_tokens;
};

struct CheckpointArguments {
  std::string save;
  std::string load;
  int64_t save_interval = 0;
  bool no_save_optim = false;
  bool no_save_rng = false;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;   // weights only: iteration 0, fresh optimizer/schedule/data position
  bool async_save = false;
  int keep_last = 0;       // --keep-last N (Megatron has no retention flag); 0 keeps every checkpoint
  bool load_fallback_to_intact = false;  // ours: resume from the newest intact checkpoint when --load's is not
  int64_t ckpt_step = 0;   // --ckpt-step N: load --load's iteration N instead of the tracker's (0: the tracker's)
  bool use_checkpoint_args = false;  // the model arguments come from --load's checkpoint (trainer/pretrain.cpp)
};

struct Arguments {
  ModelArguments model;
  TrainingArguments training;
  ParallelArguments parallel;
  DataArguments data;
  CheckpointArguments checkpoint;
  MoeArguments moe;
  Fp8Arguments fp8;
  RecomputeArguments recompute;
  LoggingArguments logging;
  // Flags given that this build refuses, one sentence each ("--flag value: why; what to use instead"), listed
  // among the constraint violations so that every problem is reported at once.
  std::vector<std::string> refused;

  int data_parallel_size() const;
  int padded_vocab_size() const;  // vocab_size rounded up to make_vocab_size_divisible_by * TP
  // --use-megatron-fsdp's --data-parallel-sharding-strategy: gradients / parameters persist only as shards.
  bool fsdp_shards_grads() const;
  bool fsdp_shards_params() const;
  int num_micro_batches() const;  // per iteration on each data-parallel rank: GBS / (MBS x DP)
};

// Fills the derived defaults (ffn size, kv channels, query groups, max positions, global batch, decay
// iters) the way Megatron does. Idempotent.
void resolve(Arguments& args);

// Every violated cross-field constraint, one sentence each naming the flags and their values; empty when
// the configuration is valid. Call after resolve().
std::vector<std::string> constraint_violations(const Arguments& args);

// resolve() then throws megatron::Error listing every violation at once.
void resolve_and_validate(Arguments& args);

// The pipeline split the flags ask for (resolved arguments): which layers each model chunk holds.
parallel::PipelineSplitConfig pipeline_split_config(const Arguments& args);

}  // namespace megatron::train
