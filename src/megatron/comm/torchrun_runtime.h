// TorchrunRuntime: the DistributedRuntime of a torchrun (env://) launch; no MPI is involved.
//
//   torchrun --nproc_per_node=8 [--nnodes=N --rdzv_backend=c10d --rdzv_endpoint=HOST:29500] pretrain_gpt ...
//
// The rank, world size and local rank come from RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE: the ranks of
// this node). The first world() performs the rendezvous (tcp_rendezvous.h) on MASTER_ADDR at the port
// launch_environment.h chose, after opening this rank's data listener (any free port); its result is the
// SocketMesh every world() communicator and its splits share (SocketCommunicator). GPU ranks broadcast
// NCCL's unique id over that world, exactly as they do over MPI's.
// abort() ends this process at once; torchrun's agent sees a worker fail and stops the others.
#pragma once

#include <memory>

#include "megatron/comm/distributed_runtime.h"
#include "megatron/comm/launch_environment.h"

namespace megatron::comm {

class SocketMesh;

class TorchrunRuntime final : public DistributedRuntime {
 public:
  explicit TorchrunRuntime(TorchrunEnvironment env);
  ~TorchrunRuntime() override;

  int world_rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  int local_rank() const override { return env_.local_rank; }
  int local_size() const override { return env_.local_world_size; }
  std::string local_rank_origin() const override { return "LOCAL_RANK"; }
  std::string describe() const override;

  std::unique_ptr<Communicator> world(std::chrono::milliseconds timeout) const override;
  [[noreturn]] void abort(int status) const override;

 private:
  TorchrunEnvironment env_;
  mutable std::shared_ptr<SocketMesh> mesh_;  // made by the first world()
  mutable uint64_t worlds_ = 0;
};

}  // namespace megatron::comm
