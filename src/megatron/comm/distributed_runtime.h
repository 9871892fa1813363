// DistributedRuntime: the process's place in a launch and the start of its collectives, whichever launcher
// started it. One per process, made first thing in main() by start_distributed_runtime():
//   - mpirun / srun (MPI): MpiRuntime (mpi_runtime.h), CPU collectives over MPI, NCCL's id broadcast over MPI;
//   - torchrun, or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT: TorchrunRuntime
//     (torchrun_runtime.h), CPU collectives over TCP sockets (SocketCommunicator), NCCL's id broadcast over them;
//   - no launcher: MpiRuntime as a world of one.
// launch_environment.h says how the launcher is recognised.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "megatron/comm/communicator.h"

namespace megatron::comm {

class DistributedRuntime {
 public:
  virtual ~DistributedRuntime() = default;

  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  // The rank among the processes of this node, which picks the GPU, and their number.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // Where local_rank() comes from, for messages: "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", ...
  virtual std::string local_rank_origin() const = 0;
  // "torchrun (env://): 2 ranks, rendezvous on 127.0.0.1:29501 (MASTER_PORT + 1 ...)" for the start-of-run log.
  virtual std::string describe() const = 0;

  // A new communicator over every process, for CPU tensors (collective: every rank calls it equally often).
  // `timeout` (--distributed-timeout-minutes) also bounds the rendezvous of the first call, where there is one.
  virtual std::unique_ptr<Communicator> world(std::chrono::milliseconds timeout) const = 0;

  // Ends this process with `status` such that the launcher ends the others (MPI_Abort; under torchrun the
  // agent stops the other workers when one exits with an error).
  [[noreturn]] virtual void abort(int status) const = 0;
};

// Recognises the launcher (launch_environment.h) and starts its runtime; throws megatron::Error naming every
// inconsistent launch variable.
std::unique_ptr<DistributedRuntime> start_distributed_runtime();

}  // namespace megatron::comm
