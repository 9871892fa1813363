#include "socket_world.h"

#include "megatron/comm/socket_communicator.h"
#include "megatron/comm/tcp_rendezvous.h"

namespace megatron::testing {

std::unique_ptr<comm::Communicator> socket_world(comm::Communicator& mpi_world, std::chrono::milliseconds timeout) {
  // Rank 0 asks the system for a free port; another process could take it before the rendezvous binds it
  // again, which is unlikely enough for a test (the rendezvous would then say the port is held).
  int32_t port[1] = {0};
  if (mpi_world.rank() == 0) {
    comm::Socket probe = comm::listen_on(0, "test rendezvous port probe");
    port[0] = comm::bound_port(probe);
  }
  mpi_world.broadcast(Tensor::from_blob(port, Shape{1}, DType::I32, Device::cpu()), 0);
  comm::Socket listener = comm::listen_on(0, "test socket communicator listener");
  const int data_port = comm::bound_port(listener);
  std::vector<comm::Endpoint> endpoints = comm::rendezvous(comm::RendezvousRequest{
      .rank = mpi_world.rank(),
      .world_size = mpi_world.size(),
      .master_addr = "127.0.0.1",
      .port = port[0],
      .port_origin = "picked by the test",
      .job_id = "socket-world-test",
      .data_port = data_port,
      .timeout = timeout});
  auto mesh =
      std::make_shared<comm::SocketMesh>(mpi_world.rank(), std::move(endpoints), std::move(listener), 42, timeout);
  return comm::SocketCommunicator::world(std::move(mesh), 7, timeout);
}

}  // namespace megatron::testing
