// MpiRuntime: the process's MPI session (RAII). One per process, made first thing in main() by tools that
// launch under `mpirun -np N` or `srun` (and also run without them, as a world of one).
//
// Construction calls MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) unless MPI is
// initialised already; the destructor calls MPI_Finalize when this object initialised it. Without a
// launcher, OpenMPI's singleton init gives a world of one.
// local_rank(): the rank among the processes on this node, which picks the GPU: OMPI_COMM_WORLD_LOCAL_RANK
// (mpirun), else SLURM_LOCALID (srun), else the rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
#pragma once

#include <chrono>
#include <memory>

#include "megatron/comm/communicator.h"

namespace megatron::comm {

class MpiRuntime {
 public:
  MpiRuntime();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // A new communicator over every process (a duplicate of MPI_COMM_WORLD) for CPU tensors.
  std::unique_ptr<Communicator> world(std::chrono::milliseconds timeout) const;

  // Ends every process of the job with `status` (MPI_Abort on MPI_COMM_WORLD): used when one rank fails
  // and the others would otherwise wait for it.
  [[noreturn]] static void abort(int status);

 private:
  bool initialised_here_ = false;
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace megatron::comm
