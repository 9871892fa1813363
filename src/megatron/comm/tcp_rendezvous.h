// The rendezvous of an env:// (torchrun) launch: every rank learns where every other rank listens for the
// socket communicator's connections, through rank 0.
//
// Rank 0 listens on the rendezvous port (launch_environment.h says which: MASTER_PORT, MASTER_PORT + 1, or
// MEGATRON_RENDEZVOUS_PORT) on every interface. Every other rank connects to MASTER_ADDR on that port,
// retrying while nobody answers yet, and sends a hello: our magic number, the protocol version, its rank,
// the world size, the port of its own data listener and the job id (launch_environment.h). Rank 0 checks the
// hello (same job, same world size, a rank in range that has not joined yet; otherwise it answers with the
// reason and closes), and once all WORLD_SIZE - 1 ranks have joined answers each with the table of every
// rank's data endpoint. A rank's host in the table is the address rank 0 saw its connection come from, i.e.
// the address of the interface that rank uses to reach MASTER_ADDR; rank 0's host is MASTER_ADDR as each
// rank resolved it. Then the rendezvous connections close: it is used once per process.
//
// Messages are little-endian: hello = u32 magic 0x5647524d ("MRGV"), u32 version 1, u32 rank, u32 world
// size, u32 data port, u32 job id length, job id bytes; answer = u32 magic, u32 status (0 accepted, 1
// refused), u32 text length, text (the reason when refused), then when accepted one (u32 host length, host,
// u32 port) per rank.
//
// Everything is bounded by `timeout` (--distributed-timeout-minutes): rank 0 reports which ranks never
// joined; the others report that they could not reach rank 0 (the host, the port and where the port comes
// from, and the last connection error). Both throw megatron::Error.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "megatron/comm/tcp_socket.h"

namespace megatron::comm {

struct RendezvousRequest {
  int rank = 0, world_size = 1;
  std::string master_addr;
  int port = 0;
  std::string port_origin;  // "MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT)", for messages
  std::string job_id;
  int data_port = 0;        // this rank's data listener
  std::chrono::milliseconds timeout{600'000};
};

// Collective over all ranks of the launch. Returns every rank's data endpoint, indexed by rank (this rank's
// own entry included, with the host it is known by to the others as far as this rank can tell).
std::vector<Endpoint> rendezvous(const RendezvousRequest& request);

}  // namespace megatron::comm
