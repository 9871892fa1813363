// For test executables that run under `mpiexec -np N` (linked with mpi_main.cpp instead of gtest_main):
// the process's MPI session and a world communicator. Every rank runs every test in the same order, so
// collectives inside tests match across ranks; a rank that fails an assertion and leaves a collective
// unmatched ends the run through the communicator's watchdog (2 minutes) instead of hanging ctest.
// The exit status is a failure on every rank when any rank failed.
#pragma once

#include <memory>

#include "megatron/comm/communicator.h"
#include "megatron/comm/mpi_runtime.h"

namespace megatron::testing {

comm::MpiRuntime& mpi_runtime();
// Over every rank of the test, MPI, CPU tensors.
std::shared_ptr<comm::Communicator> mpi_world();

}  // namespace megatron::testing
