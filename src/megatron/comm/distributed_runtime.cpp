#include "megatron/comm/distributed_runtime.h"

#include "megatron/comm/launch_environment.h"
#include "megatron/comm/mpi_runtime.h"
#include "megatron/comm/torchrun_runtime.h"

namespace megatron::comm {

std::unique_ptr<DistributedRuntime> start_distributed_runtime() {
  const LaunchEnvironment launch = detect_launch();
  if (launch.launcher == Launcher::Torchrun) return std::make_unique<TorchrunRuntime>(launch.torchrun);
  return std::make_unique<MpiRuntime>();  // an MPI launch, or none: MPI's singleton world of one
}

}  // namespace megatron::comm
