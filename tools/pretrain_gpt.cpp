// pretrain_gpt: train a GPT/Llama-style model with Megatron-LM's flags, on CPU or GPUs, in parallel over the
// ranks of an mpirun, srun or torchrun launch (one process per GPU; without a launcher, a world of one).
//
//   pretrain_gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
//       --micro-batch-size 4 --global-batch-size 8 --train-iters 100 --lr 1e-3 --mock-data --vocab-size 4096
//   mpirun -np 2 pretrain_gpt ... --use-distributed-optimizer --overlap-grad-reduce
//   mpirun -np 4 pretrain_gpt ... --tensor-model-parallel-size 2 --sequence-parallel   # TP=2 x DP=2
//   torchrun --no-python --nproc_per_node=8 --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 pretrain_gpt ...
//
// Everything a run does is the library's trainer::pretrain (src/megatron/trainer/pretrain.h); this file
// starts the launch's runtime (comm/distributed_runtime.h), answers --help and --list-flags, and turns an error on
// any rank into a message and the end of every rank (MPI_Abort, or under torchrun this rank's exit, upon which
// the agent stops the others: they would otherwise wait for it until the collective timeout).
#include <iostream>

#include "megatron/comm/distributed_runtime.h"
#include "megatron/train/flags.h"
#include "megatron/trainer/pretrain.h"

using namespace megatron;

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << "usage: pretrain_gpt [Megatron-LM flags]\n\n" << train::flags_help();
      return 0;
    }
    if (a == "--list-flags") {  // ours: every flag with its status, tab-separated (docs/flags.md is checked against it)
      for (const train::FlagStatusRow& row : train::flag_statuses())
        std::cout << row.name << "\t" << row.status << "\t" << row.reason << "\n";
      return 0;
    }
  }
  std::unique_ptr<comm::DistributedRuntime> runtime;
  try {
    runtime = comm::start_distributed_runtime();
  } catch (const std::exception& e) {
    std::cerr << "pretrain_gpt: error starting the distributed runtime: " << e.what() << "\n";
    return 1;
  }
  try {
    return trainer::pretrain(args, *runtime);
  } catch (const std::exception& e) {
    const bool many = runtime->world_size() > 1;
    std::cerr << (many ? str_cat("[rank ", runtime->world_rank(), "] ") : std::string()) << "pretrain_gpt: error: "
              << e.what() << "\n"
              << std::flush;
    if (many) runtime->abort(1);
    return 1;
  }
}
