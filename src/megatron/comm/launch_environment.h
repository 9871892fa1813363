// How this process was launched, read from its environment: by an MPI launcher (mpirun, srun with PMI or
// PMIx), by torchrun (or any launcher that sets torch's env:// variables), or by nothing (a world of one).
//
// Detection, first match wins:
//   1. TORCHELASTIC_RUN_ID is set: a torchrun worker. This wins over MPI variables, which a worker inherits
//      when torchrun itself was started by srun or mpirun (one agent per node): they describe the agent.
//   2. An MPI launcher's variables: OMPI_COMM_WORLD_SIZE (OpenMPI's mpirun), PMIX_RANK (PMIx: OpenMPI 5,
//      srun --mpi=pmix), PMI_RANK or PMI_SIZE (MPICH's hydra, srun --mpi=pmi2).
//   3. RANK and WORLD_SIZE are both set: an env:// launch (torchrun's variables set by another launcher).
//   4. Otherwise no launcher.
//
// An env:// launch (1 or 3) reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and
// LOCAL_WORLD_SIZE when present (1 otherwise: one process per node). Every inconsistency is reported at once,
// naming the variable, its value and the constraint.
//
// The rendezvous port (where rank 0 listens for the others, on MASTER_ADDR's host; tcp_rendezvous.h):
//   - MEGATRON_RENDEZVOUS_PORT when set (the same value on every node);
//   - else MASTER_PORT + 1 when TORCHELASTIC_USE_AGENT_STORE is true: torchrun's agent serves its own
//     key-value store (c10d TCPStore) on MASTER_PORT for the whole run, so that port is taken;
//   - else MASTER_PORT itself (free for rank 0, as torch's own workers would bind it: torch 1.x's c10d
//     rendezvous, or a launcher that only sets the variables).
// Why not speak to torchrun's store instead: its wire protocol is torch's internal detail and changed
// incompatibly between versions (torch 1.13 numbers its commands from SET = 0; torch 2.x inserts VALIDATE = 0
// in front, and its libuv server ignores a client until it has sent that handshake). A client cannot
// tell the two apart without sending bytes the other version misreads, which could take down the agent's
// store and with it the job. A port of our own works the same under every torch version.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace megatron::comm {

enum class Launcher { None, Mpi, Torchrun };
const char* launcher_name(Launcher launcher);  // "none", "mpi", "torchrun"

struct TorchrunEnvironment {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int rendezvous_port = 0;
  // Where rendezvous_port comes from, for messages: "MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT)".
  std::string rendezvous_port_origin;
  // Tells this job's rendezvous from another one's that answers on the same port (a stale or foreign job).
  std::string job_id;
};

struct LaunchEnvironment {
  Launcher launcher = Launcher::None;
  TorchrunEnvironment torchrun;  // meaningful when launcher == Torchrun
};

// Reads one variable: its value, or nullopt when unset.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws megatron::Error listing every inconsistent variable of an env:// launch.
LaunchEnvironment detect_launch(const EnvironmentLookup& env);
// The same over this process's environment.
LaunchEnvironment detect_launch();

}  // namespace megatron::comm
