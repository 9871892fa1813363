// For the MPI test executables: a SocketCommunicator world over the same processes, built through the TCP
// rendezvous a torchrun launch uses (rank 0 picks a free port and tells the others over MPI), so the socket
// engine can be checked against direct computation and against MPI in one job.
#pragma once

#include <chrono>
#include <memory>

#include "megatron/comm/communicator.h"

namespace megatron::testing {

// Collective over `mpi_world` (every rank calls it). The result has the same ranks, in the same order.
std::unique_ptr<comm::Communicator> socket_world(comm::Communicator& mpi_world, std::chrono::milliseconds timeout);

}  // namespace megatron::testing
