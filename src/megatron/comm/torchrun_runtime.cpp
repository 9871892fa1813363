#include "megatron/comm/torchrun_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "megatron/comm/socket_communicator.h"
#include "megatron/comm/tcp_rendezvous.h"

namespace megatron::comm {
namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

TorchrunRuntime::TorchrunRuntime(TorchrunEnvironment env) : env_(std::move(env)) {}

TorchrunRuntime::~TorchrunRuntime() = default;

std::string TorchrunRuntime::describe() const {
  return str_cat("torchrun (env://): ", env_.world_size, " ranks, ", env_.local_world_size,
                 " on this node; rendezvous on ", Endpoint{env_.master_addr, env_.rendezvous_port}.text(), " (",
                 env_.rendezvous_port_origin, "), collectives of CPU ranks over TCP sockets");
}

std::unique_ptr<Communicator> TorchrunRuntime::world(std::chrono::milliseconds timeout) const {
  if (!mesh_) {
    Socket listener = listen_on(0, str_cat("rank ", env_.rank, "'s socket communicator listener"));
    const int data_port = bound_port(listener);
    std::vector<Endpoint> endpoints = rendezvous(RendezvousRequest{
        .rank = env_.rank,
        .world_size = env_.world_size,
        .master_addr = env_.master_addr,
        .port = env_.rendezvous_port,
        .port_origin = env_.rendezvous_port_origin,
        .job_id = env_.job_id,
        .data_port = data_port,
        .timeout = timeout});
    mesh_ = std::make_shared<SocketMesh>(env_.rank, std::move(endpoints), std::move(listener), fnv1a(env_.job_id),
                                         timeout);
  }
  // Every rank makes its worlds in the same order, so the n-th world has the same channels everywhere.
  return SocketCommunicator::world(mesh_, fnv1a(str_cat("world#", worlds_++)), timeout);
}

void TorchrunRuntime::abort(int status) const {
  std::cout.flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace megatron::comm
