// pretrain(): a whole training job with Megatron-LM's flags, as a library call (tools/pretrain_gpt parses
// nothing itself). On every rank of an MPI or torchrun launch (a world of one without a launcher):
//   1. parse and validate the flags (every violated constraint listed at once), the tokenizer deciding the
//      vocabulary;
//   2. the environment: the local rank's GPU (or the CPU), the world communicator (NCCL between GPU ranks,
//      its id broadcast over the launch's CPU world; between CPU ranks that world itself: MPI under
//      mpirun/srun, TCP sockets under torchrun) and the parallel layout (ParallelContext);
//   3. the model (its seed from --load's checkpoint when resuming), the datasets (rank 0 builds the index
//      caches first, as Megatron does), the Trainer (gradient buffers, optimizer) and the checkpoint state;
//   4. the iteration loop (TrainLoop): train_step, Megatron's log line every --log-interval (last rank),
//      validation every --eval-interval, checkpoints every --save-interval, and the exit conditions
//      (--train-iters, --exit-interval, --exit-duration-in-mins agreed over the ranks); then the final save,
//      as Megatron does, and the test-set evaluation.
// Rank 0 reports the resolved configuration, the layout, the parameter count, estimated memory and the
// optimizer state per rank; every GPU rank reports its peak memory once, and the part of it above the model
// state (weights, gradient buffers, optimizer state: what is allocated before the first step), i.e. the
// activations' peak.
#pragma once

#include <string>
#include <vector>

#include "megatron/comm/distributed_runtime.h"

namespace megatron::trainer {

// `argv`: the flags (without the program name). Returns the process exit status; throws megatron::Error
// (configuration, data, checkpoint, device) with a message naming what is wrong.
int pretrain(const std::vector<std::string>& argv, const comm::DistributedRuntime& runtime);

}  // namespace megatron::trainer
