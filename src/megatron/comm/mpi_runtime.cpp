#include "megatron/comm/mpi_runtime.h"

#include <cstdlib>
#include <string>

#include "megatron/comm/mpi_check.h"
#include "megatron/comm/mpi_communicator.h"

namespace megatron::comm {
namespace {

// A non-negative integer from the environment, or -1.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && x >= 0) ? int(x) : -1;
}

}  // namespace

MpiRuntime::MpiRuntime() {
  int initialised = 0;
  MPI_CHECK(MPI_Initialized(&initialised));
  if (!initialised) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    initialised_here_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));

  // The node-local rank: the launcher's word first, the shared-memory group otherwise.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK_MSG(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node),
                " (world rank ", world_rank_, " of ", world_size_, ")");
  int node_rank = 0, node_size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  MPI_Comm_free(&node);
  local_size_ = node_size;
  local_rank_ = node_rank;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (int v = env_int(name); v >= 0) {
      local_rank_ = v;
      local_rank_origin_ = name;
      break;
    }
  }
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialised_here_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiRuntime::world(std::chrono::milliseconds timeout) const {
  return MpiCommunicator::duplicate_world(timeout);
}

std::string MpiRuntime::describe() const {
  return world_size_ == 1 ? std::string("no launcher: a world of one")
                          : str_cat("MPI (mpirun / srun): ", world_size_, " ranks, ", local_size_, " on this node");
}

void MpiRuntime::abort(int status) const {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (initialised && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

}  // namespace megatron::comm
