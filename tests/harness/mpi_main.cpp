// main() of the MPI test executables (see mpi_world.h).
#include <gtest/gtest.h>

#include "mpi_world.h"

namespace megatron::testing {
namespace {
// The test process's session; set by main() before any test runs, cleared after the last.
struct MpiTestState {
  comm::MpiRuntime* runtime = nullptr;
  std::shared_ptr<comm::Communicator> world;
};
MpiTestState& state() {
  static MpiTestState s;
  return s;
}
}  // namespace

comm::MpiRuntime& mpi_runtime() { return *state().runtime; }
std::shared_ptr<comm::Communicator> mpi_world() { return state().world; }

}  // namespace megatron::testing

int main(int argc, char** argv) {
  using namespace megatron;
  comm::MpiRuntime mpi;
  auto& s = megatron::testing::state();
  s.runtime = &mpi;
  s.world = mpi.world(comm::timeout_from_minutes(2.0));
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) GTEST_FLAG_SET(output, "");  // one XML report (rank 0's)
  int rc = RUN_ALL_TESTS();
  double failed[1] = {rc != 0 ? 1.0 : 0.0};
  s.world->all_reduce_host(failed, comm::ReduceOp::Max);
  if (failed[0] != 0 && rc == 0 && mpi.world_rank() == 0)
    std::fprintf(stderr, "another rank failed a test (see its output above)\n");
  s.world.reset();
  s.runtime = nullptr;
  return failed[0] != 0 ? 1 : 0;
}
