#include "megatron/trainer/pretrain.h"

#include "megatron/trainer/checkpoint_args.h"
#include "megatron/trainer/layout_search.h"
#include "megatron/trainer/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <unistd.h>  // sysconf: the machine's physical memory

#include "megatron/comm/self_communicator.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#endif
#include "megatron/data/sft/sft_dataset.h"
#include "megatron/data/tokenizers/tokenizer.h"
#include "megatron/parallel/parallel_context.h"
#include "megatron/runtime/cpu_threads.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/model_chunks.h"
#include "megatron/trainer/train_loop.h"

namespace megatron::trainer {
namespace {

std::string gib(double bytes) { return str_cat(bytes / double(1ull << 30), " GiB"); }

// --dry-run-layouts' budget from its flags; the host memory, unless given, is this machine's (the planner is
// usually run on the node it plans for).
LayoutBudget layout_budget(const train::TrainingArguments& t) {
  MEGATRON_CHECK(t.dry_run_gpu_memory > 0, "--dry-run-gpu-memory ", t.dry_run_gpu_memory, ": must be > 0 (GiB per GPU)");
  MEGATRON_CHECK(t.dry_run_host_memory >= 0, "--dry-run-host-memory ", t.dry_run_host_memory,
                 ": must be >= 0 (GiB per node; 0: this machine's)");
  MEGATRON_CHECK(t.dry_run_gpus_per_node >= 1, "--dry-run-gpus-per-node ", t.dry_run_gpus_per_node, ": must be >= 1");
  const double gib_bytes = double(1ull << 30);
  double host = t.dry_run_host_memory * gib_bytes;
  if (host == 0) host = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  return {.gpu_bytes = t.dry_run_gpu_memory * gib_bytes, .host_bytes_per_node = host,
          .gpus_per_node = t.dry_run_gpus_per_node};
}

// The tokenizer decides the vocabulary (unless --vocab-size is given with mock data); returns the
// end-of-document token (the last id when there is no tokenizer). A tokenizer type this build lacks (no PCRE2,
// no sentencepiece) is refused by the factory, naming the missing library.
// The tokenizer's vocabulary size into the arguments (when a tokenizer is given); returns its end-of-document
// token, or -1.
data::TokenizerConfig tokenizer_config(const train::Arguments& args) {
  data::TokenizerConfig tc;
  tc.type = args.data.tokenizer_type;
  tc.vocab_file = args.data.vocab_file;
  tc.merge_file = args.data.merge_file;
  tc.tokenizer_model = args.data.tokenizer_model;
  tc.tiktoken_pattern = args.data.tiktoken_pattern;
  tc.tiktoken_num_special_tokens = args.data.tiktoken_num_special_tokens;
  tc.tiktoken_special_tokens = args.data.tiktoken_special_tokens;
  if (args.model.vocab_size > 0) tc.vocab_size = args.model.vocab_size;
  return tc;
}

int64_t tokenizer_vocabulary(train::Arguments& args) {
  int64_t eod = -1;
  if (!args.data.tokenizer_type.empty()) {
    const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(tokenizer_config(args));
    args.model.vocab_size = int(tokenizer->vocab_size());
    eod = tokenizer->eod();
  }
  return eod;
}

int64_t configure_vocabulary(train::Arguments& args) {
  const int64_t eod = tokenizer_vocabulary(args);
  train::resolve_and_validate(args);
  return eod >= 0 ? eod : args.model.vocab_size - 1;
}

// The local rank's GPU (ranks of a node take its GPUs in turn), or the CPU.
Device pick_device(const std::string& requested, const comm::DistributedRuntime& runtime) {
  if (requested == "cpu") return Device::cpu();
  const int count = cuda_device_count();
  if (requested != "cuda" && count == 0) return Device::cpu();
  MEGATRON_CHECK(count > 0, "--device cuda: no CUDA device is visible");
  if (runtime.world_size() == 1) return Device::cuda(0);
  MEGATRON_CHECK(runtime.local_size() <= count, runtime.local_size(), " ranks run on this node but it has ", count,
                 " visible GPU(s); launch one rank per GPU");
  MEGATRON_CHECK(runtime.local_rank() < count, "local rank ", runtime.local_rank(), " (", runtime.local_rank_origin(),
                 ") has no GPU: this node has ", count, " visible GPU(s) (CUDA_VISIBLE_DEVICES); launch one rank per GPU");
  return Device::cuda(runtime.local_rank());
}

// The world communicator: NCCL between GPU ranks (its id broadcast over the launch's CPU world), the CPU world
// itself between CPU ranks (MPI under mpirun/srun, sockets under torchrun), none for a world of one.
std::shared_ptr<comm::Communicator> make_world(const comm::DistributedRuntime& runtime, Device device,
                                               const train::Arguments& args) {
  const auto timeout = comm::timeout_from_minutes(args.parallel.distributed_timeout_minutes);
  if (runtime.world_size() == 1) return std::make_shared<comm::SelfCommunicator>(device, "world", timeout);
  std::unique_ptr<comm::Communicator> cpu_world = runtime.world(timeout);
  if (device.is_cpu()) return cpu_world;
  MEGATRON_CHECK(args.parallel.distributed_backend == "nccl", "--distributed-backend ",
                 args.parallel.distributed_backend, ": GPU ranks communicate through NCCL (",
                 cpu_world->backend(), " carries CPU tensors)");
#if MEGATRON_WITH_NCCL
  return comm::NcclCommunicator::create(*cpu_world, device.index, "world", timeout, runtime.world_rank());
#else
  MEGATRON_FAIL("this build has no NCCL (not found at configure time), so ", runtime.world_size(),
                " GPU ranks cannot communicate; rebuild with NCCL or train with --device cpu");
#endif
}

parallel::ParallelSizes parallel_sizes(const train::ParallelArguments& p) {
  return {.tensor_model_parallel = p.tensor_model_parallel_size,
          .pipeline_model_parallel = p.pipeline_model_parallel_size,
          .context_parallel = p.context_parallel_size,
          .expert_model_parallel = p.expert_model_parallel_size,
          .expert_tensor_parallel = p.expert_tensor_parallel_size,
          .hierarchical_context_parallel = p.hierarchical_context_parallel_sizes};
}

// Rank 0: the device, the parameter count (over every stage, replicated parameters once), the model state's
// estimated bytes per rank and, with pipelining, the layers of each stage.
void report_parameters(const std::vector<nn::GPTModel*>& chunks, const train::Arguments& args,
                       const parallel::ParallelContext& parallel, Device device) {
  int64_t on_this_rank = 0;
  double total[1] = {0}, experts[1] = {0};  // expert parameters are spread over the expert model-parallel group
  for (nn::GPTModel* chunk : chunks)
    for (const nn::Parameter* p : chunk->parameters()) {
      on_this_rank += p->value.numel();
      if (!p->placement.duplicate()) (p->placement.expert ? experts : total)[0] += double(p->value.numel());
    }
  if (parallel.model_parallel().member()) parallel.model_parallel().comm->all_reduce_host(total, comm::ReduceOp::Sum);
  parallel.expert_model_parallel().comm->all_reduce_host(experts, comm::ReduceOp::Sum);
  total[0] += experts[0];
  if (parallel.world_rank() != 0) return;
  if (parallel.pp_size() > 1)
    std::cout << "pipeline stages (layers per model chunk): "
              << parallel::describe(parallel::split_layers(train::pipeline_split_config(args))) << "\n";
  // Weights in the parameter dtype, fp32 main grads, fp32 master (unless fp32 params) and two moments (the
  // last two divided over DP by the distributed optimizer).
  const DType dtype = chunks.front()->config().params_dtype;
  const double optimizer_bytes = double((dtype == DType::F32 ? 0 : 4) + 8) /
                                 (args.parallel.use_distributed_optimizer ? double(parallel.dp_cp().size()) : 1.0);
  const double bytes_per_param = double(dtype_size(dtype)) + 4 + optimizer_bytes;
  std::cout << "device: " << device << (device.is_cpu() ? str_cat(" (CPU threads: ", cpu_threads(), ")") : std::string())
            << (parallel.world_size() > 1 ? " (rank 0)" : "") << ", parameters: "
            << int64_t(total[0]) << " (" << total[0] / 1e6 << " M)"
            << (parallel.tp_size() * parallel.pp_size() > 1 ? str_cat(", ", on_this_rank, " on this rank") : std::string())
            << ", estimated weights + grads + optimizer state per rank: "
            << gib(double(on_this_rank) * bytes_per_param) << " (activations not included)\n";
}

// Optimizer state per rank (the distributed optimizer's shards differ slightly: the largest is reported).
void report_optimizer_state(const Trainer& trainer, const train::Arguments& args, comm::Communicator& world) {
  double state[3] = {double(trainer.optimizer_state_bytes()), double(trainer.optimizer_allocated_bytes()),
                     double(trainer.optimizer_host_state_bytes())};
  world.all_reduce_host(state, comm::ReduceOp::Max);
  if (world.rank() != 0) return;
  std::cout << "optimizer state per rank (fp32 master weights + Adam moments"
            << (args.parallel.use_distributed_optimizer ? str_cat(", sharded over DP x CP ", trainer.parallel().dp_cp().size())
                                                        : std::string(", replicated"))
            << "): " << gib(state[0]) << " computed, " << gib(state[1]) << " allocated (max over ranks)"
            << (args.training.optimizer_cpu_offload
                    ? str_cat("; offloaded to host memory (--optimizer-offload-fraction ",
                              args.training.optimizer_offload_fraction, "): ", gib(state[2]),
                              " with the gradient and parameter staging")
                    : std::string())
            << "\n" << std::flush;
}

// For tests only: MEGATRON_TEST_STRAGGLER="RANK:MILLISECONDS" makes rank RANK's every training sample read
// that much slower, a straggler for the straggler detector's test to find. Unset (always, outside that test):
// nothing.
void slow_down_for_tests(SampleStream& train, int rank) {
  const char* spec = std::getenv("MEGATRON_TEST_STRAGGLER");
  if (spec == nullptr) return;
  int slow_rank = -1, milliseconds = 0;
  MEGATRON_CHECK(std::sscanf(spec, "%d:%d", &slow_rank, &milliseconds) == 2 && milliseconds >= 0,
                 "MEGATRON_TEST_STRAGGLER='", spec, "' must be RANK:MILLISECONDS");
  if (rank != slow_rank) return;
  std::cout << "MEGATRON_TEST_STRAGGLER: rank " << rank << " reads every training sample " << milliseconds
            << " ms slower\n";
  train.add_read_delay(std::chrono::milliseconds(milliseconds));
}

// Rank 0 builds (and caches) the dataset indices first, as Megatron does; the others then read them.
std::unique_ptr<TrainingData> load_data(const train::Arguments& args, int64_t eod, comm::Communicator& world) {
  std::unique_ptr<TrainingData> data;
  if (world.rank() == 0) data = std::make_unique<TrainingData>(args, eod);
  world.barrier();
  if (world.rank() != 0) data = std::make_unique<TrainingData>(args, eod);
  if (world.rank() == 0) std::cout << "datasets:\n" << data->describe();
  return data;
}

// --sft: every rank tokenises and packs the conversations (deterministic, so all agree); the streams own
// their datasets.
RunStreams sft_streams(const train::Arguments& args, comm::Communicator& world) {
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(tokenizer_config(args));
  const data::SftDatasetConfig config{
      .path = args.data.data_path[0], .split = args.data.split, .seq_length = args.model.seq_length,
      .format = data::resolve_chat_format(args.data.sft_tokenizer_prompt_format, args.data.tokenizer_model)};
  std::array<std::optional<data::SftDataset>, data::kNumSplits> sets = data::build_sft_datasets(config, *tokenizer);
  std::array<SampleStream, data::kNumSplits> streams;
  std::string described;
  for (int s = 0; s < data::kNumSplits; ++s) {
    if (!sets[size_t(s)]) continue;
    auto set = std::make_shared<const data::SftDataset>(std::move(*sets[size_t(s)]));
    streams[size_t(s)] = SampleStream([set](int64_t i, std::span<int64_t> out) { set->sample(i, out); }, set->size(),
                                      set->row_width(), tokenizer->eod(), SampleLayout::PackedConversations);
    described += str_cat("  ", data::split_name(data::Split(s)), ": ", set->size(), " packed rows of ",
                         set->conversations(), " conversations (", set->truncated(), " cut to --seq-length + 1)\n");
  }
  if (world.rank() == 0)
    std::cout << "datasets (--sft, " << config.path << ", chat format " << data::chat_format_name(config.format)
              << "):\n" << described << std::flush;
  return RunStreams{streams[0], streams[1], streams[2]};
}

}  // namespace

int pretrain(const std::vector<std::string>& argv, const comm::DistributedRuntime& runtime) {
  train::Arguments args = train::parse_arguments(argv);
  args.parallel.world_size = runtime.world_size();
  for (const std::string& change : apply_checkpoint_args(args))  // --use-checkpoint-args
    if (runtime.world_rank() == 0) std::cout << "--use-checkpoint-args: " << change << "\n";
  if (args.training.dry_run_layouts > 0) {  // the flags' model and batch on other layouts: validated per candidate
    tokenizer_vocabulary(args);
    if (runtime.world_rank() == 0) {
      const int gpus = args.training.dry_run_layouts;
      const LayoutBudget budget = layout_budget(args.training);
      std::cout << describe(search_layouts(args, gpus, budget), args, gpus, budget);
    }
    return 0;
  }
  if (args.training.dry_run && args.training.dry_run_world_size > 0)
    args.parallel.world_size = args.training.dry_run_world_size;
  const int64_t eod = configure_vocabulary(args);
  if (args.training.dry_run) {  // nothing is allocated: the plan from the flags alone
    if (runtime.world_rank() == 0) {
      const double step = estimated_step_seconds(args);
      const double tokens = double(args.training.global_batch_size) * args.model.seq_length;
      char estimate[160];
      std::snprintf(estimate, sizeof estimate,
                    "estimated step time: %.3f s, %.0f tokens/s over %d GPUs (--dry-run-layouts' estimate, "
                    "trainer/layout_search.h)\n",
                    step, tokens / step, args.parallel.world_size);
      std::cout << train::describe_arguments(args) << estimate << describe(plan_memory(args), args);
    }
    return 0;
  }

  const Device device = pick_device(args.training.device, runtime);
  // cuDNN has no dropout with a bottom-right causal mask: all_gather's blocks of queries over a longer key prefix.
  const auto& cp_types = args.parallel.cp_comm_type;
  const bool all_gather_cp = args.parallel.context_parallel_size > 1 &&
                             std::any_of(cp_types.begin(), cp_types.end(),
                                         [](const std::string& t) { return t == "all_gather" || t == "allgather"; });
  MEGATRON_CHECK(device.is_cpu() || args.model.attention_dropout == 0 || !all_gather_cp, "--attention-dropout ",
                 args.model.attention_dropout, " (Megatron's default is 0.1) with --cp-comm-type all_gather does not ",
                 "run on GPUs: cuDNN's fused attention has no dropout for a block of queries over a longer key prefix; ",
                 "use --cp-comm-type p2p or a2a, or --attention-dropout 0");
  const std::unique_ptr<Context> ctx = Context::create(device);
  configure_cpu_threads(args.training.cpu_threads, runtime.local_size());  // --cpu-threads, else a share of the node
  ctx->set_deterministic(args.training.deterministic_mode);
  const std::shared_ptr<comm::Communicator> world = make_world(runtime, device, args);
  const parallel::ParallelContext parallel = parallel::ParallelContext::create(world, parallel_sizes(args.parallel));
  if (world->rank() == 0)
    std::cout << train::describe_arguments(args) << "launch: " << runtime.describe() << "\n"
              << parallel.describe() << std::flush;

  RunCheckpoints checkpoints(*ctx, args, *world);
  const std::vector<std::unique_ptr<nn::GPTModel>> owned_chunks = build_model_chunks(
      *ctx, train::transformer_config(args, checkpoints.model_seed()),
      tensor_parallel(*ctx, parallel, args),
      context_parallel(parallel, args), args, parallel.pp().rank(), moe_parallel(parallel));
  const std::vector<nn::GPTModel*> chunks = chunk_pointers(owned_chunks);
  report_parameters(chunks, args, parallel, device);
  std::unique_ptr<TrainingData> data;
  RunStreams streams;
  if (args.data.sft) {
    streams = sft_streams(args, *world);
  } else {
    data = load_data(args, eod, *world);
    streams = RunStreams{data->stream(data::Split::train), data->stream(data::Split::valid),
                         data->stream(data::Split::test)};
  }
  slow_down_for_tests(streams.train, world->rank());
  Trainer trainer(*ctx, args, chunks, parallel);
  report_optimizer_state(trainer, args, *world);
  checkpoints.attach(chunks, trainer);
  const int64_t start_iteration = checkpoints.load(streams.train, streams.valid);

  TrainLoop(*ctx, args, trainer, checkpoints, streams, *world).run(start_iteration);
  return 0;
}

}  // namespace megatron::trainer
