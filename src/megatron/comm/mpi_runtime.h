// MpiRuntime: the process's MPI session (RAII), the DistributedRuntime of `mpirun -np N` and `srun` launches
// (and of runs without a launcher, as a world of one). One per process, made first thing in main() through
// start_distributed_runtime() (or directly, by the MPI test harness).
//
// Construction calls MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) unless MPI is
// initialised already; the destructor calls MPI_Finalize when this object initialised it. Without a
// launcher, OpenMPI's singleton init gives a world of one.
// local_rank(): the rank among the processes on this node, which picks the GPU: OMPI_COMM_WORLD_LOCAL_RANK
// (mpirun), else SLURM_LOCALID (srun), else the rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
#pragma once

#include <chrono>
#include <memory>

#include "megatron/comm/distributed_runtime.h"

namespace megatron::comm {

class MpiRuntime final : public DistributedRuntime {
 public:
  MpiRuntime();
  ~MpiRuntime() override;
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const override { return world_rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string local_rank_origin() const override { return local_rank_origin_; }
  std::string describe() const override;

  // A new communicator over every process (a duplicate of MPI_COMM_WORLD) for CPU tensors.
  std::unique_ptr<Communicator> world(std::chrono::milliseconds timeout) const override;

  // Ends every process of the job with `status` (MPI_Abort on MPI_COMM_WORLD): used when one rank fails
  // and the others would otherwise wait for it.
  [[noreturn]] void abort(int status) const override;

 private:
  bool initialised_here_ = false;
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string local_rank_origin_ = "the rank among the processes sharing this node's memory";
};

}  // namespace megatron::comm
